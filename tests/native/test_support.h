// Minimal support shared by the native kernel tests (no external framework): a deterministic RNG,
// closeness checks that report where and by how much results differ, and a pass/fail tally that
// becomes the process exit code, so ctest sees failures.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

namespace pygpt::test {

// SplitMix64: the same sequence on every platform and compiler.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}

  uint64_t next_u64() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  // Uniform in [0, 1).
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

  // Uniform integer in [lo, hi).
  int64_t integer(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(next_u64() % static_cast<uint64_t>(hi - lo));
  }

  // Standard normal (Box-Muller).
  double normal() {
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

  // n values drawn from N(mean, stddev^2), rounded to T.
  template <typename T>
  std::vector<T> normal_vector(size_t n, double mean = 0.0, double stddev = 1.0) {
    std::vector<T> v(n);
    for (T& e : v) e = static_cast<T>(mean + stddev * normal());
    return v;
  }

 private:
  uint64_t state_;
};

// printf into a std::string, for naming test cases.
inline std::string format(const char* fmt, ...) {
  char buf[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, args);
  va_end(args);
  return buf;
}

template <typename T>
const char* type_name() {
  return std::is_same_v<T, float> ? "float" : "double";
}

// Relative tolerance of a kernel in precision T against a double oracle.
template <typename T>
constexpr double kTol = std::is_same_v<T, float> ? 1e-5 : 1e-10;

template <typename T>
std::vector<double> to_double(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Largest |v[i]| over the finite entries (the scale tolerances are taken relative to), at least 1.
inline double scale_of(const std::vector<double>& v) {
  double m = 1.0;
  for (double e : v) {
    if (std::isfinite(e)) m = std::max(m, std::abs(e));
  }
  return m;
}

// Central-difference gradient of loss() with respect to every element of params (which loss()
// reads), for checking a double-precision backward against its forward.
template <typename F>
std::vector<double> numerical_gradient(F&& loss, std::vector<double>& params, double h = 1e-6) {
  std::vector<double> grad(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const double saved = params[i];
    params[i] = saved + h;
    const double up = loss();
    params[i] = saved - h;
    const double down = loss();
    params[i] = saved;
    grad[i] = (up - down) / (2.0 * h);
  }
  return grad;
}

// Counts checks and failures for the whole test program.
class Tally {
 public:
  static Tally& get() {
    static Tally tally;
    return tally;
  }

  void record(bool ok, const std::string& what) {
    ++checks_;
    if (!ok) {
      ++failures_;
      std::printf("FAIL: %s\n", what.c_str());
    }
  }

  // Prints a summary; returns the exit code for main().
  int finish(const char* program) const {
    std::printf("%s: %ld checks, %ld failed\n", program, checks_, failures_);
    return failures_ == 0 ? 0 : 1;
  }

 private:
  long checks_ = 0;
  long failures_ = 0;
};

inline void check(bool ok, const std::string& what) { Tally::get().record(ok, what); }

// |got - ref| <= atol + rtol * |ref|, elementwise; NaN matches NaN and an infinity matches the same
// infinity. Reports the mismatch count and the first few mismatches with their index and values.
template <typename T>
void expect_close(const std::string& what, const T* got, const double* ref, size_t n, double atol,
                  double rtol) {
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const double g = static_cast<double>(got[i]), r = ref[i];
    const bool ok = (std::isnan(g) && std::isnan(r)) || g == r ||
                    std::abs(g - r) <= atol + rtol * std::abs(r);
    if (!ok && ++bad <= 5) {
      std::printf("  %s[%zu]: got %.17g, expected %.17g (diff %.3g, allowed %.3g)\n", what.c_str(),
                  i, g, r, std::abs(g - r), atol + rtol * std::abs(r));
    }
  }
  check(bad == 0, format("%s: %zu of %zu elements differ", what.c_str(), bad, n));
}

template <typename T>
void expect_close(const std::string& what, const std::vector<T>& got,
                  const std::vector<double>& ref, double atol, double rtol) {
  check(got.size() == ref.size(), what + ": size mismatch");
  expect_close(what, got.data(), ref.data(), std::min(got.size(), ref.size()), atol, rtol);
}

// The tolerance every kernel-vs-oracle comparison uses: kTol<T> relative to the oracle's scale.
template <typename T>
void expect_matches_oracle(const std::string& what, const std::vector<T>& got,
                           const std::vector<double>& ref) {
  expect_close(what, got, ref, kTol<T> * scale_of(ref), kTol<T>);
}

// Bitwise-equal results (e.g. the same rows computed within a different range split).
template <typename T>
void expect_identical(const std::string& what, const std::vector<T>& got,
                      const std::vector<T>& ref) {
  expect_close(what, got, to_double(ref), 0.0, 0.0);
}

}  // namespace pygpt::test
