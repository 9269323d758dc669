// Tensor <-> JSON nested lists: the one codec behind REST predict (TF Serving
// and KServe v2 JSON), JSON Lines instances (`kiln predict`,
// `kiln batch-predict`) and their outputs.
//
// Reading. A value is a number (a scalar) or nested lists of numbers; the
// shape is read off the first element at each depth and every other list must
// agree (no ragged lists). Booleans read as 0/1. Errors are ValueError naming
// `what` and the index path of the bad element:
//   "input 'x' holds "a" at [0][1] where a number belongs"
//   "input 'x' is a ragged list: every list at depth 1 must have 2 entries; [1] has 1"
//   NestedNumbers n = json_to_numbers(j, "input 'x'");
//   at::Tensor t = json_to_tensor(j, at::kFloat, "input 'x'");
//
// Writing. Numbers in the shortest text that reads back to the same value in
// the tensor's own precision (float32, float16 and bfloat16 as float32:
// 0.1f is "0.1"), integers as integers, bools as true/false, NaN and
// infinities as null (as nlohmann writes them). append_tensor_json() writes
// text; tensor_to_json() builds the DOM whose dump() is the same text.
// JsonWriteOptions::non_finite_literals writes NaN, Infinity and -Infinity
// instead of null (text only: not JSON, but what TF Serving's REST API
// writes and its clients read); tf_serving_decimals writes finite floats
// digit for digit as TF Serving does ("1.0", not "1").
//
// Stateless and thread-safe.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "kiln/core/json.h"
#include "kiln/core/shape.h"

namespace kiln {

struct JsonNumberOptions {
  // Also read the strings "NaN", "Infinity" and "-Infinity" (TF Serving's
  // REST API writes non-finite numbers so).
  bool special_float_strings = false;
};

struct JsonWriteOptions {
  // NaN, Infinity, -Infinity as bare tokens instead of null.
  bool non_finite_literals = false;
  // Finite floats as TF Serving's REST API writes them (json_tensor.cc,
  // WriteDecimal): printf's %g (6 significant digits) when that reads back
  // to the same value, else max_digits10 digits (9 for float32, 17 for
  // float64); then ".0" after a whole number not in exponent form. So 1 is
  // "1.0", 0.1f "0.1", 1e6 "1e+06", 0.123456789f "0.123456791". Off: the
  // shortest text that reads back ("1", "0.12345679").
  bool tf_serving_decimals = false;
};

// Row-major values of nested lists and their shape ({} for a scalar).
struct NestedNumbers {
  std::vector<double> values;
  Shape shape;
};

// ValueError (see above); lists nested deeper than kMaxJsonDepth are refused.
NestedNumbers json_to_numbers(const Json& value, const std::string& what, JsonNumberOptions options = {});

// Row-major `values` of `shape` -> a new tensor of `dtype` (integral dtypes:
// the values must already be whole numbers).
at::Tensor numbers_to_tensor(const std::vector<double>& values, const std::vector<int64_t>& shape,
                             at::ScalarType dtype);
// The same, checking first: ValueError "<what> expects integers (int32);
// received 1.500000" for a fraction or non-finite value and an integral dtype.
at::Tensor checked_numbers_to_tensor(const std::vector<double>& values, const std::vector<int64_t>& shape,
                                     at::ScalarType dtype, const std::string& what);

// json_to_numbers + checked_numbers_to_tensor.
at::Tensor json_to_tensor(const Json& value, at::ScalarType dtype, const std::string& what,
                          JsonNumberOptions options = {});

// Strings (string tensors, kiln/core/string_tensor.h): a JSON string, or
// nested lists of them, read as numbers are (shape off the first element at
// each depth, no ragged lists). With `b64`, an object {"b64": "..."} is a
// string too, its base64 bytes decoded (TF Serving's rule for bytes).
// ValueError naming `what`, the dtype and the index path otherwise:
//   "input 'text' expects dtype string. Received: 3 at [1]"
struct NestedStrings {
  std::vector<std::string> values;
  Shape shape;
};
NestedStrings json_to_strings(const Json& value, const std::string& what, bool b64 = true);
// json_to_strings + strings::encode.
at::Tensor json_to_string_tensor(const Json& value, const std::string& what, bool b64 = true);
// A string tensor's strings as nested lists of JSON strings (invalid UTF-8
// replaced when dumped, as every kiln reply writes text).
Json string_tensor_to_json(const at::Tensor& t);
// TF Serving's {"b64": "..."} object (exactly one key, "b64").
bool is_b64_object(const Json& v);
// For a numeric input: ValueError "<what> expects dtype float32. Received:
// string ("abc")" when the first value of `value` (nested lists) is a
// string, the reverse of json_to_strings's check ("NaN", "Infinity" and
// "-Infinity" pass when `options` read them as numbers).
void refuse_strings(const Json& value, at::ScalarType dtype, const std::string& what, JsonNumberOptions options = {});

// A finite whole number (what an integral dtype accepts).
bool is_whole_number(double d);

// One number as JSON text (shortest round trip; null when not finite,
// unless options say otherwise).
void append_json_number(std::string& out, float v, JsonWriteOptions options = {});
void append_json_number(std::string& out, double v, JsonWriteOptions options = {});
void append_json_number(std::string& out, int64_t v);

// Nested lists of `t` (any dtype, any device) appended to `out`.
void append_tensor_json(std::string& out, const at::Tensor& t, JsonWriteOptions options = {});
// The same as a DOM value: tensor_to_json(t).dump() == append_tensor_json's text.
Json tensor_to_json(const at::Tensor& t);

}  // namespace kiln
