// The REST fast paths (TF Serving predict, KServe v2 infer; see
// rest_codec.h): simdjson's On-Demand API reads the numbers of the common
// bodies straight into one buffer, without a DOM. Chosen over a hand-written scanner because simdjson validates the
// JSON grammar (numbers, strings, structure) and parses numbers exactly
// (correctly rounded), at several GB/s; it is packaged by Debian
// (libsimdjson-dev). Anything outside the common shape returns false, and
// the caller takes the DOM path, which accepts every form and words the
// errors, so both paths give the same answer for every body.
#include <simdjson.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <string_view>
#include <vector>

#include "kiln/core/string_tensor.h"
#include "kiln/serving/codec/rest_codec.h"

namespace kiln::serving {
namespace {

namespace od = simdjson::ondemand;

// Deeper lists than this take the DOM path (which checks the server's
// --max_json_depth limit and explains it).
constexpr size_t kMaxListDepth = 32;

// Nested lists of numbers, rectangular, none empty; numbers in row-major order.
struct Numbers {
  std::vector<int64_t> shape;  // -1 until the first list at that depth closes
  size_t leaf_depth = SIZE_MAX;
  std::vector<double> data;
};

// Reads one JSON number as a double, correctly rounded. simdjson 3.0.1
// (Debian's) overflows its digit count on a number whose integer part is 0
// and whose fraction has more than 19 digits: it reads
// 0.111111111111111111110 as 4.3e-4 (simdjson issue #2093, fixed upstream
// in 3.6.3; found here by fuzz/rest_predict_fuzz). No shorter token can
// have that many digits, so a token longer than 20 characters is read again
// with std::from_chars (libstdc++'s is correctly rounded). A number that
// from_chars calls out of range (1e-400, 1e400) goes to the DOM path, which
// reads it as strtod does.
bool read_double(od::value& v, double& d) {
  std::string_view token = v.raw_json_token();  // before get_double moves past it
  if (v.get_double().get(d)) return false;
  if (token.size() <= 20) return true;
  auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!token.empty() && blank(token.back())) token.remove_suffix(1);  // a raw token keeps the blanks after it
  const char* end = token.data() + token.size();
  auto [ptr, ec] = std::from_chars(token.data(), end, d);
  return ec == std::errc() && ptr == end;
}

// Reads a list (nested lists down to numbers) at `depth`. The first
// element of the first list at each depth fixes what that depth holds;
// from the first number on, every element of a list at the leaf depth is
// read straight as a number (anything else fails get_double, and the DOM
// path takes over), without asking each element its type.
bool collect(od::value v, size_t depth, Numbers& n) {
  if (depth >= kMaxListDepth || depth >= n.leaf_depth) return false;
  od::array a;
  if (v.get_array().get(a)) return false;
  if (n.shape.size() <= depth) n.shape.resize(depth + 1, -1);
  int64_t count = 0;
  for (auto element : a) {
    od::value e;
    if (element.get(e)) return false;
    if (n.leaf_depth == SIZE_MAX) {
      od::json_type type;
      if (e.type().get(type)) return false;
      if (type == od::json_type::number) n.leaf_depth = depth + 1;
    }
    if (n.leaf_depth == depth + 1) {
      double d;
      if (!read_double(e, d)) return false;
      n.data.push_back(d);
    } else if (!collect(e, depth + 1, n)) {
      return false;
    }
    ++count;
  }
  if (count == 0) return false;
  if (n.shape[depth] < 0) n.shape[depth] = count;
  return n.shape[depth] == count;
}

// Room for the numbers of a body of `size` bytes: each takes at least two
// (a digit and a comma); capped, so a large body grows its buffer as usual.
void reserve_for(Numbers& n, size_t size) { n.data.reserve(std::min(size / 2, size_t{1} << 16)); }

struct ThreadState {
  od::parser parser;
  std::vector<char> padded;  // the body plus simdjson's padding
};

// Starts iterating `body` as a JSON object (this thread's parser; `doc`
// lives until the next call on this thread).
bool start_object(std::string_view body, od::document& doc, od::object& obj) {
  thread_local ThreadState ts;
  ts.padded.resize(body.size() + simdjson::SIMDJSON_PADDING);
  std::memcpy(ts.padded.data(), body.data(), body.size());
  if (ts.parser.iterate(ts.padded.data(), body.size(), ts.padded.size()).get(doc)) return false;
  return doc.get_object().get(obj) == simdjson::SUCCESS;
}

// After the object: nothing but whitespace may follow.
bool at_end(od::document& doc) {
  const char* trailing = nullptr;
  return doc.current_location().get(trailing) != simdjson::SUCCESS;
}

bool read_string(od::value v, std::string& out) {
  std::string_view s;
  if (v.get_string().get(s)) return false;
  out.assign(s);
  return true;
}

// {"name", "shape", "datatype", "data"}, each once, nothing else.
bool read_kserve_input(od::object in, KServeInferInput& x) {
  bool name = false, shape = false, datatype = false, data = false;
  for (auto field : in) {
    std::string_view key;
    od::value v;
    if (field.unescaped_key().get(key) || field.value().get(v)) return false;
    if (key == "name" && !name) {
      if (!read_string(v, x.name)) return false;
      name = true;
    } else if (key == "datatype" && !datatype) {
      if (!read_string(v, x.datatype)) return false;
      datatype = true;
    } else if (key == "shape" && !shape) {
      od::array a;
      if (v.get_array().get(a)) return false;
      for (auto e : a) {
        int64_t d;
        if (e.get_int64().get(d) || d < 0) return false;
        x.shape.push_back(d);
      }
      shape = true;
    } else if (key == "data" && !data) {
      Numbers n;  // not reserved: a body may hold many inputs, and each keeps its buffer
      if (!collect(v, 0, n) || n.shape.empty()) return false;
      x.numbers = std::move(n.data);
      data = true;
    } else {
      return false;
    }
  }
  x.has_numbers = true;
  return name && shape && datatype && data;
}

}  // namespace

bool decode_kserve_infer_fast(std::string_view body, KServeInferBody* out) {
  od::document doc;
  od::object obj;
  if (!start_object(body, doc, obj)) return false;
  KServeInferBody b;
  bool inputs = false, outputs = false, id = false;
  for (auto field : obj) {
    std::string_view key;
    od::value v;
    if (field.unescaped_key().get(key) || field.value().get(v)) return false;
    if (key == "inputs" && !inputs) {
      od::array a;
      if (v.get_array().get(a)) return false;
      for (auto element : a) {
        od::object in;
        KServeInferInput x;
        if (element.get_object().get(in) || !read_kserve_input(in, x)) return false;
        b.inputs.push_back(std::move(x));
      }
      inputs = true;
    } else if (key == "outputs" && !outputs) {
      od::array a;
      if (v.get_array().get(a)) return false;
      for (auto element : a) {  // {"name": "..."} each
        od::object o;
        if (element.get_object().get(o)) return false;
        bool named = false;
        for (auto f : o) {
          std::string_view k;
          od::value ov;
          std::string name;
          if (f.unescaped_key().get(k) || k != "name" || named || f.value().get(ov) || !read_string(ov, name))
            return false;
          b.outputs.push_back(std::move(name));
          named = true;
        }
        if (!named) return false;
      }
      outputs = true;
    } else if (key == "id" && !id) {
      std::string s;
      if (!read_string(v, s)) return false;
      b.id = s;
      id = true;
    } else {
      return false;  // parameters, unknown or repeated keys
    }
  }
  if (!at_end(doc) || !inputs) return false;
  *out = std::move(b);
  return true;
}

bool decode_predict_fast(std::string_view body, const Json& signatures, PredictCall* call) {
  od::document doc;
  od::object obj;
  if (!start_object(body, doc, obj)) return false;

  std::string signature = kDefaultSignature;
  bool seen_signature = false, seen_values = false, row_format = true;
  Numbers n;
  reserve_for(n, body.size());
  for (auto field : obj) {
    std::string_view key;
    if (field.unescaped_key().get(key)) return false;
    od::value v;
    if (field.value().get(v)) return false;
    if (key == "signature_name" && !seen_signature) {
      std::string s;
      if (!read_string(v, s)) return false;
      if (!s.empty()) signature = s;
      seen_signature = true;
    } else if ((key == "instances" || key == "inputs") && !seen_values) {
      row_format = key == "instances";
      if (!collect(v, 0, n) || n.shape.empty()) return false;
      seen_values = true;
    } else {
      return false;  // unknown or repeated key
    }
  }
  // Trailing content after the object: the DOM path reports it.
  if (!at_end(doc) || !seen_values) return false;

  if (!signatures.contains(signature)) return false;
  const Json& inputs = signatures[signature]["inputs"];
  if (inputs.size() != 1) return false;
  const std::string& name = inputs.begin().key();
  const Json& spec = inputs.begin().value();
  at::ScalarType dtype = input_dtype(spec);
  if (is_string_dtype(dtype)) return false;  // numbers for a string input: the DOM path words the error
  if (at::isIntegralType(dtype, /*includeBool=*/true) && !std::all_of(n.data.begin(), n.data.end(), is_integer))
    return false;  // the DOM path words the error

  call->signature_name = signature;
  call->row_format = row_format;
  call->inputs.clear();
  call->inputs[name] = numbers_to_tensor(n.data, n.shape, dtype);
  return true;
}

}  // namespace kiln::serving
