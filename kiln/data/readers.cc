#include "kiln/data/readers.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <unordered_map>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/core/json.h"
#include "kiln/core/json_limits.h"

namespace kiln::data {
namespace {

// ------------------------------------------------------------------- IDX

class GzFile {
 public:
  explicit GzFile(const std::string& path) : path_(path) {
    if (!path_exists(path)) throw NotFoundError("IDX file not found: " + path);
    f_ = gzopen(path.c_str(), "rb");
    if (!f_) throw IOError("cannot open " + path + ": " + std::strerror(errno));
    gzbuffer(f_, 1 << 18);
  }
  ~GzFile() {
    if (f_) gzclose(f_);
  }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  // Reads up to n bytes; returns how many (fewer only at the end).
  size_t read(void* out, size_t n) {
    size_t done = 0;
    char* p = static_cast<char*>(out);
    while (done < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - done, 1u << 30));
      const int got = gzread(f_, p + done, chunk);
      if (got < 0) {
        int code = 0;
        const char* msg = gzerror(f_, &code);
        throw FormatError("IDX file " + path_ + ": corrupt compressed data: " + (msg ? msg : "zlib error"));
      }
      if (got == 0) {
        int code = 0;
        const char* msg = gzerror(f_, &code);
        if (code != Z_OK && code != Z_STREAM_END) {
          throw FormatError("IDX file " + path_ +
                            ": corrupt or truncated compressed data: " + (msg ? msg : "zlib error"));
        }
        break;
      }
      done += static_cast<size_t>(got);
    }
    return done;
  }

 private:
  std::string path_;
  gzFile f_ = nullptr;
};

uint32_t big_endian_u32(const unsigned char* b) {
  return (uint32_t(b[0]) << 24) | (uint32_t(b[1]) << 16) | (uint32_t(b[2]) << 8) | uint32_t(b[3]);
}

void byteswap_inplace(at::Tensor& t) {
  const size_t width = t.element_size();
  if (width == 1) return;
  auto* p = static_cast<unsigned char*>(t.data_ptr());
  const size_t n = static_cast<size_t>(t.numel());
  for (size_t i = 0; i < n; ++i, p += width) std::reverse(p, p + width);
}

// ------------------------------------------------------------ text helpers

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

bool parse_double(std::string_view s, double* out) {
  s = trim(s);
  if (s.empty()) return false;
  if (s.front() == '+') s.remove_prefix(1);
  auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

bool parse_int64(std::string_view s, int64_t* out) {
  s = trim(s);
  if (s.empty()) return false;
  if (s.front() == '+') s.remove_prefix(1);
  auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  if (r.ec == std::errc() && r.ptr == s.data() + s.size()) return true;
  double d;  // "3.0", "1e2": integral values written as floats
  if (!parse_double(s, &d) || !std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.0e15) return false;
  *out = static_cast<int64_t>(d);
  return true;
}

std::string quote(std::string_view s) { return text_excerpt(s); }

// The error for a NaN or infinity where allow_non_finite is off.
[[noreturn]] void non_finite(const std::string& where, int64_t row, const std::string& column, double v) {
  throw FormatError(where + ": row " + std::to_string(row) + ", column " + column + " holds " +
                    (std::isnan(v) ? "nan"
                     : v > 0       ? "inf"
                                   : "-inf") +
                    "; non-finite values make the model's weights NaN. Fix the data, or set allow_non_finite "
                    "(`data.allow_non_finite` in a train spec) to keep them");
}

at::Tensor labels_tensor(std::vector<int64_t>& ints, std::vector<float>& floats, LabelType type) {
  if (ints.empty() && floats.empty()) return at::empty({0}, type == LabelType::kInt64 ? at::kLong : at::kFloat);
  if (type == LabelType::kInt64) {
    return at::from_blob(ints.data(), {static_cast<int64_t>(ints.size())}, at::kLong).clone();
  }
  return at::from_blob(floats.data(), {static_cast<int64_t>(floats.size())}, at::kFloat).clone();
}

at::Tensor features_tensor(std::vector<float>& values, int64_t rows, int64_t cols) {
  if (rows == 0) return at::empty({0, cols}, at::kFloat);
  return at::from_blob(values.data(), {rows, cols}, at::kFloat).clone();
}

// -------------------------------------------------------------------- CSV

// Splits one record starting at *pos; advances *pos past its line end and
// *line past the lines it spans. False at the end of the data.
bool next_csv_record(const std::string& data, size_t* pos, char delim, std::vector<std::string>* fields, int64_t* line,
                     const std::string& path) {
  fields->clear();
  if (*pos >= data.size()) return false;
  std::string field;
  bool quoted = false;
  bool was_quoted = false;
  const int64_t start_line = *line;
  size_t i = *pos;
  for (; i < data.size(); ++i) {
    const char c = data[i];
    if (quoted) {
      if (c == '"') {
        if (i + 1 < data.size() && data[i + 1] == '"') {
          field += '"';
          ++i;
        } else {
          quoted = false;
        }
      } else {
        if (c == '\n') ++*line;
        field += c;
      }
    } else if (c == '"' && trim(field).empty() && !was_quoted) {
      field.clear();
      quoted = was_quoted = true;
    } else if (c == delim) {
      fields->push_back(std::move(field));
      field.clear();
      was_quoted = false;
    } else if (c == '\n') {
      break;
    } else {
      field += c;
    }
  }
  if (quoted) {
    throw FormatError(path + ":" + std::to_string(start_line) + ": unterminated quoted field");
  }
  fields->push_back(std::move(field));
  *pos = i + 1;
  ++*line;
  return true;
}

bool blank_record(const std::vector<std::string>& fields) { return fields.size() == 1 && trim(fields[0]).empty(); }

}  // namespace

// ------------------------------------------------------------------- IDX

at::Tensor read_idx(const std::string& path) {
  GzFile f(path);
  unsigned char magic[4];
  if (f.read(magic, 4) < 4) throw FormatError("IDX file " + path + ": truncated header (shorter than 4 bytes)");
  char hex[16];
  std::snprintf(hex, sizeof hex, "0x%08X", big_endian_u32(magic));
  if (magic[0] != 0 || magic[1] != 0) {
    throw FormatError("IDX file " + path + ": bad magic number " + hex +
                      ", expected 0x0000TTNN (T: data type, N: number of dims); is it an IDX file?");
  }
  at::ScalarType type;
  switch (magic[2]) {
    case 0x08:
      type = at::kByte;
      break;
    case 0x09:
      type = at::kChar;
      break;
    case 0x0B:
      type = at::kShort;
      break;
    case 0x0C:
      type = at::kInt;
      break;
    case 0x0D:
      type = at::kFloat;
      break;
    case 0x0E:
      type = at::kDouble;
      break;
    default:
      throw FormatError("IDX file " + path + ": unknown data type byte in magic number " + hex +
                        ", expected 0x08, 0x09, 0x0B, 0x0C, 0x0D or 0x0E");
  }
  const int ndim = magic[3];
  if (ndim == 0) throw FormatError("IDX file " + path + ": magic number " + hex + " declares 0 dimensions");
  std::vector<unsigned char> dim_bytes(4 * ndim);
  if (f.read(dim_bytes.data(), dim_bytes.size()) < dim_bytes.size()) {
    throw FormatError("IDX file " + path + ": truncated header: expected " + std::to_string(ndim) + " dimensions");
  }
  std::vector<int64_t> dims(ndim);
  uint64_t numel = 1;
  std::string dims_text;
  for (int d = 0; d < ndim; ++d) {
    dims[d] = big_endian_u32(&dim_bytes[4 * d]);
    dims_text += (d ? "x" : "") + std::to_string(dims[d]);
    numel *= static_cast<uint64_t>(dims[d]);
    if (numel > (uint64_t(1) << 40)) {
      throw FormatError("IDX file " + path + ": implausible dimensions " + dims_text + "... (corrupt header?)");
    }
  }
  at::Tensor t = at::empty(dims, at::TensorOptions().dtype(type));
  const size_t nbytes = numel * t.element_size();
  const size_t got = f.read(t.data_ptr(), nbytes);
  if (got < nbytes) {
    throw FormatError("IDX file " + path + ": truncated: dims " + dims_text + " need " + std::to_string(nbytes) +
                      " bytes of data, found " + std::to_string(got));
  }
  char extra;
  if (f.read(&extra, 1) != 0) {
    throw FormatError("IDX file " + path + ": extra bytes after the " + std::to_string(nbytes) +
                      " bytes of data that dims " + dims_text + " describe");
  }
  byteswap_inplace(t);  // IDX is big-endian; kiln's hosts are little-endian
  return t;
}

// -------------------------------------------------------------------- CSV

Element LabeledTensors::tensors() const {
  if (labels.defined()) return {features, labels};
  return {features};
}

LabeledTensors read_csv(const std::string& path, const CsvOptions& options) {
  const std::string data = read_file(path);
  size_t pos = 0;
  int64_t line = 1;
  std::vector<std::string> fields;
  // Header: the first non-blank record.
  std::vector<std::string> header;
  while (next_csv_record(data, &pos, options.delimiter, &fields, &line, path)) {
    if (!blank_record(fields)) {
      for (auto& f : fields) header.emplace_back(trim(f));
      break;
    }
  }
  if (header.empty()) throw FormatError("CSV file " + path + " is empty: expected a header row");
  std::unordered_map<std::string, size_t> column;
  for (size_t i = 0; i < header.size(); ++i) {
    if (!column.emplace(header[i], i).second) {
      throw FormatError(path + ":1: duplicate column name " + quote(header[i]));
    }
  }
  auto column_index = [&](const std::string& name, const char* what) {
    auto it = column.find(name);
    if (it == column.end()) {
      std::string names;
      for (size_t i = 0; i < header.size(); ++i) names += (i ? ", " : "") + header[i];
      throw ValueError("read_csv: " + std::string(what) + " " + quote(name) + " is not a column of " + path +
                       "; its columns are: " + names);
    }
    return it->second;
  };
  const bool has_label = !options.label_column.empty();
  const size_t label_col = has_label ? column_index(options.label_column, "label_column") : 0;
  LabeledTensors out;
  std::vector<size_t> feature_cols;
  if (options.feature_columns.empty()) {
    for (size_t i = 0; i < header.size(); ++i) {
      if (!has_label || i != label_col) {
        feature_cols.push_back(i);
        out.feature_names.push_back(header[i]);
      }
    }
  } else {
    for (const auto& name : options.feature_columns) {
      feature_cols.push_back(column_index(name, "feature column"));
      out.feature_names.push_back(name);
    }
  }
  std::vector<float> values;
  std::vector<int64_t> int_labels;
  std::vector<float> float_labels;
  int64_t rows = 0;
  for (;;) {
    const int64_t record_line = line;
    if (!next_csv_record(data, &pos, options.delimiter, &fields, &line, path)) break;
    if (blank_record(fields)) continue;
    const std::string where = path + ":" + std::to_string(record_line);
    if (fields.size() != header.size()) {
      throw FormatError(where + ": expected " + std::to_string(header.size()) + " columns (as in the header), found " +
                        std::to_string(fields.size()));
    }
    for (size_t c : feature_cols) {
      double v;
      if (!parse_double(fields[c], &v)) {
        throw FormatError(where + ": column " + quote(header[c]) + ": " +
                          (trim(fields[c]).empty() ? std::string("empty value")
                                                   : "cannot parse " + quote(fields[c]) + " as a number"));
      }
      if (!options.allow_non_finite && !std::isfinite(static_cast<float>(v)))
        non_finite(where, rows + 1, quote(header[c]), static_cast<float>(v));
      values.push_back(static_cast<float>(v));
    }
    if (has_label) {
      const std::string& s = fields[label_col];
      if (options.label_type == LabelType::kInt64) {
        int64_t v;
        if (!parse_int64(s, &v)) {
          throw FormatError(where + ": label column " + quote(header[label_col]) + ": " + quote(s) +
                            " is not an integer class id (use LabelType::kFloat32 for real-valued labels)");
        }
        int_labels.push_back(v);
      } else {
        double v;
        if (!parse_double(s, &v)) {
          throw FormatError(where + ": label column " + quote(header[label_col]) + ": cannot parse " + quote(s) +
                            " as a number");
        }
        if (!options.allow_non_finite && !std::isfinite(static_cast<float>(v)))
          non_finite(where, rows + 1, "label " + quote(header[label_col]), static_cast<float>(v));
        float_labels.push_back(static_cast<float>(v));
      }
    }
    ++rows;
  }
  out.features = features_tensor(values, rows, static_cast<int64_t>(feature_cols.size()));
  if (has_label) out.labels = labels_tensor(int_labels, float_labels, options.label_type);
  return out;
}

// ------------------------------------------------------------ JSON Lines

namespace {

// Appends the numbers in `v` (a number, bool or nested array) to `out`.
bool flatten_json_numbers(const Json& v, std::vector<float>* out) {
  if (v.is_number() || v.is_boolean()) {
    out->push_back(v.is_boolean() ? (v.get<bool>() ? 1.f : 0.f) : v.get<float>());
    return true;
  }
  if (v.is_array()) {
    for (const auto& x : v) {
      if (!flatten_json_numbers(x, out)) return false;
    }
    return true;
  }
  return false;
}

}  // namespace

LabeledTensors read_jsonl(const std::string& path, const JsonlOptions& options) {
  if (options.feature_keys.empty()) {
    throw ValueError("read_jsonl: received no `feature_keys`, expected the keys that hold the features");
  }
  const std::string data = read_file(path);
  LabeledTensors out;
  std::vector<int64_t> widths;  // values per feature key, from the first row
  std::vector<float> values;
  std::vector<int64_t> int_labels;
  std::vector<float> float_labels;
  int64_t rows = 0;
  size_t pos = 0;
  int64_t line_no = 0;
  std::vector<float> tmp;
  while (pos < data.size()) {
    size_t end = data.find('\n', pos);
    if (end == std::string::npos) end = data.size();
    const std::string_view line = trim(std::string_view(data).substr(pos, end - pos));
    pos = end + 1;
    ++line_no;
    if (line.empty()) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    const Json row = parse_json(std::string(line), where);
    if (!row.is_object()) throw FormatError(where + ": expected a JSON object, found " + std::string(row.type_name()));
    for (size_t k = 0; k < options.feature_keys.size(); ++k) {
      const std::string& key = options.feature_keys[k];
      auto it = row.find(key);
      if (it == row.end()) throw FormatError(where + ": missing feature key " + quote(key));
      tmp.clear();
      if (!flatten_json_numbers(*it, &tmp)) {
        throw FormatError(where + ": feature " + quote(key) + " must be a number or an array of numbers, found " +
                          json_excerpt(*it));
      }
      if (rows == 0) {
        widths.push_back(static_cast<int64_t>(tmp.size()));
        if (it->is_array()) {
          for (size_t i = 0; i < tmp.size(); ++i) out.feature_names.push_back(key + "[" + std::to_string(i) + "]");
        } else {
          out.feature_names.push_back(key);
        }
      } else if (static_cast<int64_t>(tmp.size()) != widths[k]) {
        throw FormatError(where + ": feature " + quote(key) + " has " + std::to_string(tmp.size()) + " values, but " +
                          std::to_string(widths[k]) + " in the first row");
      }
      if (!options.allow_non_finite)
        for (size_t i = 0; i < tmp.size(); ++i)
          if (!std::isfinite(tmp[i]))
            non_finite(where, rows + 1, quote(it->is_array() ? key + "[" + std::to_string(i) + "]" : key), tmp[i]);
      values.insert(values.end(), tmp.begin(), tmp.end());
    }
    if (!options.label_key.empty()) {
      auto it = row.find(options.label_key);
      if (it == row.end()) throw FormatError(where + ": missing label key " + quote(options.label_key));
      if (options.label_type == LabelType::kInt64) {
        if (it->is_number_integer()) {
          int_labels.push_back(it->get<int64_t>());
        } else if (it->is_number_float() && std::floor(it->get<double>()) == it->get<double>()) {
          int_labels.push_back(static_cast<int64_t>(it->get<double>()));
        } else {
          throw FormatError(where + ": label " + quote(options.label_key) + " must be an integer class id, found " +
                            json_excerpt(*it) + " (use LabelType::kFloat32 for real-valued labels)");
        }
      } else {
        if (!it->is_number()) {
          throw FormatError(where + ": label " + quote(options.label_key) + " must be a number, found " +
                            json_excerpt(*it));
        }
        if (!options.allow_non_finite && !std::isfinite(it->get<float>()))
          non_finite(where, rows + 1, "label " + quote(options.label_key), it->get<float>());
        float_labels.push_back(it->get<float>());
      }
    }
    ++rows;
  }
  int64_t width = 0;
  for (int64_t w : widths) width += w;
  out.features = features_tensor(values, rows, width);
  if (!options.label_key.empty()) out.labels = labels_tensor(int_labels, float_labels, options.label_type);
  return out;
}

void check_finite_features(const at::Tensor& features, const std::string& what) {
  if (!features.defined() || !at::isFloatingType(features.scalar_type()) || features.numel() == 0) return;
  const at::Tensor bad = features.isfinite().logical_not().reshape({-1});
  if (!bad.any().item<bool>()) return;
  const int64_t first = bad.nonzero()[0][0].item<int64_t>();
  const int64_t per_row = features.dim() == 0 ? 1 : features.numel() / std::max<int64_t>(1, features.size(0));
  const double v = features.reshape({-1})[first].item<double>();
  non_finite(what + " (indices from 0)", first / per_row, std::to_string(first % per_row), v);
}

// -------------------------------------------------------------------- NPY
// -------------------------------------------------------------------- NPY

namespace {

[[noreturn]] void npy_fail(const std::string& path, const std::string& what) {
  throw FormatError("NPY file " + path + ": " + what);
}

// The value text after 'key': in the header dict, or "" if absent.
std::string_view npy_field(std::string_view header, const std::string& key) {
  for (const char q : {'\'', '"'}) {
    const std::string needle = std::string(1, q) + key + std::string(1, q);
    size_t p = header.find(needle);
    if (p == std::string_view::npos) continue;
    p = header.find(':', p + needle.size());
    if (p == std::string_view::npos) return {};
    return trim(header.substr(p + 1));
  }
  return {};
}

}  // namespace

at::Tensor read_npy(const std::string& path) {
  if (!path_exists(path)) throw NotFoundError("NPY file not found: " + path);
  const std::string data = read_file(path);
  static const char kMagic[] = "\x93NUMPY";
  if (data.size() < 10 || std::memcmp(data.data(), kMagic, 6) != 0) {
    npy_fail(path, "bad magic (expected \\x93NUMPY); not a .npy file");
  }
  const int major = static_cast<unsigned char>(data[6]);
  size_t header_len, header_start;
  if (major == 1) {
    header_len = static_cast<unsigned char>(data[8]) | (static_cast<unsigned char>(data[9]) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (data.size() < 12) npy_fail(path, "truncated header");
    header_len = 0;
    for (int i = 3; i >= 0; --i) header_len = (header_len << 8) | static_cast<unsigned char>(data[8 + i]);
    header_start = 12;
  } else {
    npy_fail(path, "unsupported format version " + std::to_string(major) + "." +
                       std::to_string(static_cast<unsigned char>(data[7])) + ", expected 1.0, 2.0 or 3.0");
  }
  if (header_len > data.size() - header_start) npy_fail(path, "truncated header");
  const std::string_view header(data.data() + header_start, header_len);

  // descr
  std::string_view descr = npy_field(header, "descr");
  if (descr.size() < 2 || (descr[0] != '\'' && descr[0] != '"')) {
    npy_fail(path, "header has no 'descr' string (structured dtypes are not supported)");
  }
  descr = descr.substr(1, descr.find(descr[0], 1) - 1);
  struct Kind {
    const char* name;
    at::ScalarType type;
  };
  static const Kind kKinds[] = {{"f4", at::kFloat}, {"f8", at::kDouble}, {"i4", at::kInt}, {"i8", at::kLong},
                                {"u1", at::kByte},  {"b1", at::kBool},   {"i1", at::kChar}};
  const at::ScalarType* type = nullptr;
  if (descr.size() == 3) {
    for (const auto& k : kKinds) {
      if (descr.substr(1) == k.name) type = &k.type;
    }
  }
  if (!type) {
    npy_fail(path, "unsupported dtype '" + std::string(descr) +
                       "'; supported: <f4 <f8 <i4 <i8 |u1 |b1 |i1 (convert with arr.astype(...))");
  }
  const bool one_byte = descr[2] == '1';
  if (descr[0] == '>' && !one_byte) {
    npy_fail(path, "big-endian dtype '" + std::string(descr) + "' is not supported; save with arr.astype('<" +
                       std::string(descr.substr(1)) + "')");
  }
  if (descr[0] != '<' && descr[0] != '|' && !(one_byte && descr[0] == '>') && descr[0] != '=') {
    npy_fail(path, "unsupported byte order in dtype '" + std::string(descr) + "'");
  }

  // fortran_order
  const std::string_view fortran = npy_field(header, "fortran_order");
  if (fortran.substr(0, 4) == "True") {
    npy_fail(path, "Fortran-order arrays are not supported; save np.ascontiguousarray(arr)");
  } else if (fortran.substr(0, 5) != "False") {
    npy_fail(path, "header has no 'fortran_order' flag");
  }

  // shape
  std::string_view shape = npy_field(header, "shape");
  if (shape.empty() || shape[0] != '(') npy_fail(path, "header has no 'shape' tuple");
  const size_t close = shape.find(')');
  if (close == std::string_view::npos) npy_fail(path, "unterminated 'shape' tuple");
  shape = shape.substr(1, close - 1);
  std::vector<int64_t> dims;
  uint64_t numel = 1;
  while (!trim(shape).empty()) {
    const size_t comma = shape.find(',');
    const std::string_view item = trim(shape.substr(0, comma));
    int64_t d = 0;
    auto r = std::from_chars(item.data(), item.data() + item.size(), d);
    if (item.empty() || r.ec != std::errc() || r.ptr != item.data() + item.size() || d < 0) {
      npy_fail(path, "bad dimension '" + std::string(item) + "' in 'shape'");
    }
    dims.push_back(d);
    numel *= static_cast<uint64_t>(d);
    if (numel > (uint64_t(1) << 40)) npy_fail(path, "implausible shape (corrupt header?)");
    if (comma == std::string_view::npos) break;
    shape.remove_prefix(comma + 1);
  }

  const at::ScalarType read_type = *type == at::kBool ? at::kByte : *type;
  at::Tensor t = at::empty(dims, at::TensorOptions().dtype(read_type));
  const size_t nbytes = numel * t.element_size();
  const size_t offset = header_start + header_len;
  const size_t available = data.size() - offset;
  if (available != nbytes) {
    npy_fail(path, std::string(available < nbytes ? "truncated" : "extra bytes") + ": shape and dtype '" +
                       std::string(descr) + "' need " + std::to_string(nbytes) + " bytes of data, the file has " +
                       std::to_string(available));
  }
  if (nbytes) std::memcpy(t.data_ptr(), data.data() + offset, nbytes);
  if (*type == at::kBool) t = t.ne(0);  // any nonzero byte is true
  return t;
}

}  // namespace kiln::data
