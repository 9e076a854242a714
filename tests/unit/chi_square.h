#pragma once
// Pearson's chi-square goodness of fit, for tests that draw many samples and
// compare their counts with exact probabilities (the speculative sampling
// tests). Cells expected fewer than 5 times are pooled into one, as the test
// needs; a count in a cell of probability 0 fails outright.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace meshtrain::test {

struct ChiSquare {
  double statistic = 0;
  int64_t dof = 0;
  double critical = 0;  // the statistic exceeds it with probability ~1e-4 when the counts fit
  bool fits() const { return statistic <= critical; }
  std::string str() const {
    return "chi-square " + std::to_string(statistic) + " with " + std::to_string(dof) + " degrees of freedom, "
           "critical value " + std::to_string(critical) + " (alpha 1e-4)";
  }
};

// Wilson and Hilferty's approximation of the chi-square quantile: (X/k)^(1/3)
// is nearly normal with mean 1 - 2/(9k) and variance 2/(9k); z = 3.719 is the
// normal's upper 1e-4 quantile.
inline double chi_square_critical(int64_t dof) {
  const double k = static_cast<double>(dof), v = 2.0 / (9.0 * k);
  return k * std::pow(1.0 - v + 3.719 * std::sqrt(v), 3.0);
}

inline ChiSquare chi_square(const std::vector<double>& probs, const std::vector<int64_t>& counts) {
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  ChiSquare out;
  double pooled_expected = 0;
  int64_t pooled_count = 0, cells = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    const double e = probs[i] * static_cast<double>(n);
    if (probs[i] <= 0) {
      if (counts[i] > 0) out.statistic = std::numeric_limits<double>::infinity();
      continue;
    }
    if (e < 5) {
      pooled_expected += e;
      pooled_count += counts[i];
      continue;
    }
    const double d = static_cast<double>(counts[i]) - e;
    out.statistic += d * d / e;
    ++cells;
  }
  if (pooled_expected > 0) {
    const double d = static_cast<double>(pooled_count) - pooled_expected;
    out.statistic += d * d / pooled_expected;
    ++cells;
  }
  out.dof = cells - 1;
  out.critical = out.dof > 0 ? chi_square_critical(out.dof) : 0;
  return out;
}

}  // namespace meshtrain::test
