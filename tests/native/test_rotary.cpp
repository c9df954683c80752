// Tests the rotary kernel (csrc/cpu/rotary.h) in float and double against a double oracle
// (rotary_cases.h): shared and per-row positions, strided heads views, partial rotation with
// pass-through channels, empty shapes, the inverse rotation undoing the forward, and results
// that do not depend on how the rows are split between threads.
#include <cstdint>
#include <vector>

#include "cpu/rotary.h"
#include "rotary_cases.h"
#include "test_support.h"

namespace {

using namespace pygpt::test;

template <typename T>
std::vector<T> cast(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

template <typename T>
void run_case(const RotaryCase& c, const RotaryInputs& in, bool inverse) {
  const pygpt::RotaryShape s = rotary_shape(c, inverse);
  const std::string name = format("rotary<%s> ", type_name<T>()) + describe(c, inverse);
  const std::vector<T> x = cast<T>(in.x), cos = cast<T>(in.cos), sin = cast<T>(in.sin);
  // The oracle sees exactly the inputs the kernel sees (rounded to T).
  const RotaryInputs rounded{to_double(x), to_double(cos), to_double(sin), in.positions};
  const int64_t rows = c.B * c.H * c.T;
  std::vector<T> y(rows * c.D, T(-7)), split(rows * c.D, T(-7));
  pygpt::cpu::rotary<T>(x.data(), cos.data(), sin.data(), in.positions.data(), y.data(), s, 0,
                        rows);
  expect_matches_oracle(name + " y", y, rotary_oracle(rounded, s));
  for (int64_t begin = 0; begin < rows; begin += 3) {  // ranges of three rows
    pygpt::cpu::rotary<T>(x.data(), cos.data(), sin.data(), in.positions.data(), split.data(), s,
                          begin, begin + 3 < rows ? begin + 3 : rows);
  }
  expect_identical(name + " split rows", split, y);
  // Channels past the rotated ones are copied exactly.
  bool copied = true;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r % c.T, h = r / c.T % c.H, b = r / (c.T * c.H);
    for (int64_t j = 2 * c.half; j < c.D; ++j) {
      copied = copied && y[r * c.D + j] == x[b * s.x_b + h * s.x_h + t * s.x_t + j];
    }
  }
  check(copied, name + ": pass-through channels copied exactly");
  // The other direction, on the contiguous result, gives x back.
  pygpt::RotaryShape back = rotary_shape(RotaryCase{c.B, c.H, c.T, c.D, c.half, c.max_pos,
                                                    c.per_row, false}, !inverse);
  std::vector<T> undone(rows * c.D);
  pygpt::cpu::rotary<T>(y.data(), cos.data(), sin.data(), in.positions.data(), undone.data(),
                        back, 0, rows);
  std::vector<double> x_contiguous(rows * c.D);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r % c.T, h = r / c.T % c.H, b = r / (c.T * c.H);
    for (int64_t j = 0; j < c.D; ++j) {
      x_contiguous[r * c.D + j] = rounded.x[b * s.x_b + h * s.x_h + t * s.x_t + j];
    }
  }
  expect_close(name + " inverse undoes", undone, x_contiguous, 4 * kTol<T> * scale_of(x_contiguous),
               4 * kTol<T>);
}

}  // namespace

int main() {
  Rng rng(20261123);
  for (const RotaryCase& c : rotary_cases()) {
    const RotaryInputs in = rotary_inputs(c, rng);
    for (bool inverse : {false, true}) {
      run_case<float>(c, in, inverse);
      run_case<double>(c, in, inverse);
    }
  }
  return Tally::get().finish("test_rotary");
}
