// Helpers for tests that compare against golden data produced by
// scripts/golden/make_golden.py (PyTorch reference).
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

#include "kiln/core/json.h"

namespace kiln {

// Reads kiln/<folder>/testdata/<file> from the source tree.
Json load_golden(const std::string& relative_path);

// {"shape": [...], "dtype": "float32"|"float64"|"int64", "data": [flat]} as
// a tensor; null gives an undefined tensor.
at::Tensor golden_tensor(const Json& j);

// Same shape and |a - e| <= atol + rtol * |e| everywhere; the failure
// message names the worst entry.
::testing::AssertionResult tensors_close(const at::Tensor& actual, const at::Tensor& expected, double rtol = 1e-5,
                                         double atol = 1e-6);

// Golden configs, so that a saved model.json stays the same when config code
// changes. With KILN_WRITE_CONFIG_GOLDEN=<file> set, writes `actual` there
// and returns true (the caller then skips: GTEST_SKIP); otherwise expects
// `actual` (key -> config string) to equal the golden file at
// `relative_path` key for key, byte for byte, and returns false.
bool write_or_expect_golden_configs(const Json& actual, const std::string& relative_path);

}  // namespace kiln
