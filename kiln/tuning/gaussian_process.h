// A small Gaussian-process regressor for model-based search: Matern 5/2
// kernel with one length scale per input dimension (ARD), signal variance
// and noise variance, hyperparameters fitted by maximizing the log marginal
// likelihood (NLopt's derivative-free BOBYQA from several starts), targets
// standardized. Sizes here are tens to hundreds of points, so plain dense
// Cholesky in double precision is the right tool.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::tuning {

class GaussianProcess {
 public:
  // X: n points of d dims in [0,1]; y: n targets (larger is better or not:
  // the GP does not care). min_noise: lower bound of the noise variance.
  void fit(const std::vector<std::vector<double>>& X, const std::vector<double>& y, double min_noise = 1e-6,
           uint64_t seed = 0);
  // Posterior mean and standard deviation at x (in target units).
  void predict(const std::vector<double>& x, double* mean, double* stddev) const;
  const std::vector<double>& length_scales() const { return length_; }
  double log_marginal_likelihood() const { return lml_; }

  // Expected improvement of maximizing over `best` at (mean, stddev).
  static double expected_improvement(double mean, double stddev, double best, double xi = 0.01);

 private:
  double kernel(const double* a, const double* b) const;
  // -log marginal likelihood for log-parameters theta (d length scales,
  // signal, noise); fills the factorization when `keep`.
  double neg_lml(const std::vector<double>& theta, bool keep);

  std::vector<std::vector<double>> X_;
  std::vector<double> y_;  // standardized
  double y_mean_ = 0, y_std_ = 1;
  std::vector<double> length_;
  double signal_ = 1, noise_ = 1e-3, min_noise_ = 1e-6;
  std::vector<double> L_;      // Cholesky factor, row-major n x n (lower)
  std::vector<double> alpha_;  // K^-1 y
  double lml_ = 0;
};

}  // namespace kiln::tuning
