// The two-stage column reduction of the CPU bindings whose backward sums a per-column gradient
// over rows (a bias or weight gradient): the rows split into at most one chunk per thread, each
// chunk adds its rows into its own partial row, then the partial rows are summed. No atomics,
// and the result depends on N, C and the thread count only: it is reproducible run to run.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cstdint>

#include "bindings/parallel_rows.h"

namespace pygpt {

class RowPartials {
 public:
  // N rows of C columns; a gradient not wanted gets no partial buffer (and an empty result).
  RowPartials(int64_t N, int64_t C, bool wanted, const at::TensorOptions& options)
      : N_(N), C_(C) {
    const int64_t grain = row_grain(C);
    chunks_ = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(),
                                                     (N + grain - 1) / grain));
    parts_ = at::zeros({wanted ? chunks_ : 0, C}, options);
  }

  // Runs f(row_begin, row_end, chunk) for every chunk, the chunks in parallel.
  template <typename F>
  void for_chunks(F&& f) const {
    at::parallel_for(0, chunks_, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) f(N_ * c / chunks_, N_ * (c + 1) / chunks_, c);
    });
  }

  // The partial row of chunk c, or null when the gradient is not wanted.
  template <typename T>
  T* partial(int64_t c) const {
    return parts_.size(0) == 0 ? nullptr : parts_.data_ptr<T>() + c * C_;
  }

  // The sum over the chunks' partial rows, (C,); (0,) when the gradient is not wanted.
  at::Tensor total() const {
    if (parts_.size(0) == 0) return at::empty({0}, parts_.options());
    return parts_.size(0) == 1 ? parts_.view({C_}) : parts_.sum(0);
  }

 private:
  int64_t N_, C_, chunks_;
  at::Tensor parts_;
};

}  // namespace pygpt
