#include "kiln/tuning/gaussian_process.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlopt.hpp>
#include <random>

#include "kiln/core/error.h"

namespace kiln::tuning {

namespace {

// In-place Cholesky of a row-major n x n SPD matrix; false if not positive definite.
bool cholesky(std::vector<double>& A, size_t n) {
  for (size_t j = 0; j < n; ++j) {
    double d = A[j * n + j];
    for (size_t k = 0; k < j; ++k) d -= A[j * n + k] * A[j * n + k];
    if (d <= 0 || !std::isfinite(d)) return false;
    d = std::sqrt(d);
    A[j * n + j] = d;
    for (size_t i = j + 1; i < n; ++i) {
      double s = A[i * n + j];
      for (size_t k = 0; k < j; ++k) s -= A[i * n + k] * A[j * n + k];
      A[i * n + j] = s / d;
    }
    for (size_t k = j + 1; k < n; ++k) A[j * n + k] = 0;
  }
  return true;
}

// Solves L z = b (forward) then L^T x = z (backward).
void solve_lower(const std::vector<double>& L, size_t n, std::vector<double>& b) {
  for (size_t i = 0; i < n; ++i) {
    double s = b[i];
    for (size_t k = 0; k < i; ++k) s -= L[i * n + k] * b[k];
    b[i] = s / L[i * n + i];
  }
}
void solve_upper_t(const std::vector<double>& L, size_t n, std::vector<double>& b) {
  for (size_t ii = n; ii-- > 0;) {
    double s = b[ii];
    for (size_t k = ii + 1; k < n; ++k) s -= L[k * n + ii] * b[k];
    b[ii] = s / L[ii * n + ii];
  }
}

}  // namespace

double GaussianProcess::kernel(const double* a, const double* b) const {
  double r2 = 0;
  for (size_t k = 0; k < length_.size(); ++k) {
    double d = (a[k] - b[k]) / length_[k];
    r2 += d * d;
  }
  double r = std::sqrt(5.0 * r2);
  return signal_ * (1.0 + r + r * r / 3.0) * std::exp(-r);
}

double GaussianProcess::neg_lml(const std::vector<double>& theta, bool keep) {
  const size_t d = X_.empty() ? 0 : X_[0].size();
  const size_t n = X_.size();
  for (size_t k = 0; k < d; ++k) length_[k] = std::exp(theta[k]);
  signal_ = std::exp(theta[d]);
  noise_ = std::max(min_noise_, std::exp(theta[d + 1]));
  std::vector<double> K(n * n);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j <= i; ++j) {
      double v = kernel(X_[i].data(), X_[j].data());
      K[i * n + j] = K[j * n + i] = v;
    }
  for (size_t i = 0; i < n; ++i) K[i * n + i] += noise_;
  if (!cholesky(K, n)) return 1e25;
  std::vector<double> a = y_;
  solve_lower(K, n, a);
  double quad = 0;
  for (double v : a) quad += v * v;
  solve_upper_t(K, n, a);
  double logdet = 0;
  for (size_t i = 0; i < n; ++i) logdet += std::log(K[i * n + i]);
  const double nll = 0.5 * quad + logdet + 0.5 * n * std::log(2 * M_PI);
  if (keep) {
    L_ = std::move(K);
    alpha_ = std::move(a);
    lml_ = -nll;
  }
  return nll;
}

void GaussianProcess::fit(const std::vector<std::vector<double>>& X, const std::vector<double>& y, double min_noise,
                          uint64_t seed) {
  if (X.empty() || X.size() != y.size()) throw ValueError("GaussianProcess.fit needs as many targets as points");
  X_ = X;
  min_noise_ = min_noise;
  const size_t n = y.size(), d = X[0].size();
  y_mean_ = 0;
  for (double v : y) y_mean_ += v;
  y_mean_ /= n;
  double var = 0;
  for (double v : y) var += (v - y_mean_) * (v - y_mean_);
  y_std_ = n > 1 ? std::sqrt(var / n) : 1.0;
  if (y_std_ < 1e-12) y_std_ = 1.0;
  y_.resize(n);
  for (size_t i = 0; i < n; ++i) y_[i] = (y[i] - y_mean_) / y_std_;
  length_.assign(d, 0.5);

  // log length scales in [log 0.01, log 10], log signal in [log 0.05, log 20],
  // log noise in [log min_noise, log 1].
  const size_t p = d + 2;
  std::vector<double> lo(p), hi(p);
  for (size_t k = 0; k < d; ++k) {
    lo[k] = std::log(0.01);
    hi[k] = std::log(10.0);
  }
  lo[d] = std::log(0.05);
  hi[d] = std::log(20.0);
  lo[d + 1] = std::log(std::max(min_noise, 1e-9));
  hi[d + 1] = std::log(1.0);
  auto objective = [](const std::vector<double>& x, std::vector<double>&, void* self) {
    return static_cast<GaussianProcess*>(self)->neg_lml(x, false);
  };
  std::mt19937_64 rng(seed);
  std::vector<double> best_theta;
  double best = std::numeric_limits<double>::infinity();
  const int starts = 3;
  for (int s = 0; s < starts; ++s) {
    std::vector<double> x0(p);
    for (size_t k = 0; k < p; ++k) {
      if (s == 0) {
        x0[k] = k < d ? std::log(0.5) : (k == d ? 0.0 : std::log(std::max(1e-3, min_noise)));
      } else {
        std::uniform_real_distribution<double> u(lo[k], hi[k]);
        x0[k] = u(rng);
      }
      x0[k] = std::clamp(x0[k], lo[k], hi[k]);
    }
    nlopt::opt opt(nlopt::LN_BOBYQA, p);
    opt.set_lower_bounds(lo);
    opt.set_upper_bounds(hi);
    opt.set_min_objective(objective, this);
    opt.set_xtol_rel(1e-4);
    opt.set_maxeval(150 + 20 * (int)p);
    double f = 0;
    try {
      opt.optimize(x0, f);
    } catch (const std::exception&) {
      f = neg_lml(x0, false);  // roundoff-limited: keep where it got
    }
    if (f < best) {
      best = f;
      best_theta = x0;
    }
  }
  neg_lml(best_theta, true);
}

void GaussianProcess::predict(const std::vector<double>& x, double* mean, double* stddev) const {
  const size_t n = X_.size();
  std::vector<double> k(n);
  for (size_t i = 0; i < n; ++i) k[i] = kernel(x.data(), X_[i].data());
  double m = 0;
  for (size_t i = 0; i < n; ++i) m += k[i] * alpha_[i];
  solve_lower(L_, n, k);
  double v = signal_;
  for (double t : k) v -= t * t;
  *mean = m * y_std_ + y_mean_;
  *stddev = std::sqrt(std::max(v, 1e-12)) * y_std_;
}

double GaussianProcess::expected_improvement(double mean, double stddev, double best, double xi) {
  if (stddev <= 0) return std::max(0.0, mean - best - xi);
  const double z = (mean - best - xi) / stddev;
  const double cdf = 0.5 * std::erfc(-z / std::sqrt(2.0));
  const double pdf = std::exp(-0.5 * z * z) / std::sqrt(2 * M_PI);
  return (mean - best - xi) * cdf + stddev * pdf;
}

}  // namespace kiln::tuning
