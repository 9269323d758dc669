// Readers that turn files into tensors ready for Dataset::from_tensor_slices.
//
//   auto x = data::read_idx("train-images-idx3-ubyte.gz");       // uint8 (N, 28, 28)
//   data::CsvOptions opts;
//   opts.label_column = "species";
//   auto csv = data::read_csv("iris.csv", opts);
//   auto ds = Dataset::from_tensor_slices(csv.tensors());         // (x, y)
//
// Errors: NotFoundError when the file is missing; FormatError naming the
// file (and line, for text formats) and what is wrong: a bad magic number or
// header, a length that does not match the header, a value that is not a
// number, a row with the wrong number of columns. Whole files are read into
// memory. All functions are thread-safe.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "kiln/data/dataset.h"

namespace kiln::data {

// IDX (the MNIST format), gzip-compressed or plain (detected from the
// content, not the name): big-endian magic 0x0000TTNN with T the type
// (0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64)
// and N the number of dims, then N big-endian uint32 dims, then the data.
// Returns a tensor of that dtype with the file's dims (MNIST: uint8).
at::Tensor read_idx(const std::string& path);

enum class LabelType { kInt64, kFloat32 };

// Features and labels read from a table.
struct LabeledTensors {
  at::Tensor features;                     // (N, F) float32
  at::Tensor labels;                       // (N,) int64 or float32; undefined without a label
  std::vector<std::string> feature_names;  // F names, in column/key order
  // {features, labels}, or {features} when there is no label.
  Element tensors() const;
};

struct CsvOptions {
  // Column with the label; "" for none. Must be in the header.
  std::string label_column;
  // kInt64: class ids (integers; "3.0" is accepted, "3.5" is an error).
  LabelType label_type = LabelType::kInt64;
  // Feature columns in this order; empty: every column except the label.
  // Columns not named are ignored (they may hold text).
  std::vector<std::string> feature_columns;
  char delimiter = ',';
  // NaN and infinities (nan, inf, 1e39) in features or float labels are an
  // error naming file:line, row and column unless this is set: a model
  // trained on them ends with NaN weights.
  bool allow_non_finite = false;
};

// CSV with a header row. Fields may be double-quoted ("" escapes a quote);
// surrounding spaces are ignored; empty lines are skipped; \r\n line ends are
// fine. Every used value must be a finite number (nan/inf only with
// allow_non_finite); an empty one is an error naming file:line and the column.
LabeledTensors read_csv(const std::string& path, const CsvOptions& options = {});

struct JsonlOptions {
  // Keys whose values (a number, a bool, or a nested array of numbers,
  // flattened) are concatenated into each row's features. Required.
  std::vector<std::string> feature_keys;
  std::string label_key;  // "" for none
  LabelType label_type = LabelType::kInt64;
  // As CsvOptions::allow_non_finite (JSON has no NaN, but 1e39 becomes
  // infinity in float32).
  bool allow_non_finite = false;
};

// JSON Lines: one JSON object per line; blank lines are skipped. Every row
// must give each feature the same number of values as the first row.
// feature_names are the keys, with "[i]" appended for array elements.
LabeledTensors read_jsonl(const std::string& path, const JsonlOptions& options);

// FormatError "<what>: row R, column C holds nan ..." for the first NaN or
// infinity in `features` (rows along dim 0, columns the flattened rest);
// nothing for integer tensors. For arrays read whole (npy, IDX), whose
// readers return the values as stored.
void check_finite_features(const at::Tensor& features, const std::string& what);

// NumPy .npy, format versions 1.0, 2.0 and 3.0, C order, little-endian
// dtypes <f4 <f8 <i4 <i8 |u1 |b1 (and |i1). Returns a tensor of the matching
// dtype and shape (float32, float64, int32, int64, uint8, bool, int8).
at::Tensor read_npy(const std::string& path);

}  // namespace kiln::data
