// Fuzzes TF Serving REST predict bodies (kiln/serving/codec/rest_codec.cc and
// rest_fast_path.cc) and KServe v2 infer bodies. Both paths run on every
// input: where the simdjson fast path accepts a body, the DOM path
// (parse_request_json + decode_predict_request) must accept it too and make
// the same call (signature, format, input names, dtypes, shapes, values).
#include <cstdlib>

#include "fuzz/fuzz_util.h"
#include "kiln/serving/codec/rest_codec.h"
#include "kiln/serving/rest/rest_server.h"

namespace {

const kiln::Json& signatures() {
  static const kiln::Json sigs = {{"serving_default", {{"inputs", {{"x", {{"dtype", "float32"}}}}}}},
                                  {"ints", {{"inputs", {{"i", {{"dtype", "int64"}}}}}}},
                                  {"bytes", {{"inputs", {{"u", {{"dtype", "uint8"}}}}}}},
                                  {"flags", {{"inputs", {{"b", {{"dtype", "bool"}}}}}}},
                                  {"two", {{"inputs", {{"a", {{"dtype", "float32"}}}, {"c", {{"dtype", "int32"}}}}}}}};
  return sigs;
}

void expect_same(const kiln::serving::PredictCall& fast, const kiln::serving::PredictCall& dom) {
  if (fast.signature_name != dom.signature_name || fast.row_format != dom.row_format ||
      fast.inputs.size() != dom.inputs.size())
    abort();
  for (const auto& [name, t] : fast.inputs) {
    auto it = dom.inputs.find(name);
    if (it == dom.inputs.end()) abort();
    const at::Tensor& d = it->second;
    if (t.scalar_type() != d.scalar_type() || t.sizes() != d.sizes() || !at::equal(t, d)) abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body = kiln::fuzz::as_string(data, size);
  kiln::serving::PredictCall fast;
  bool fast_ok = false;
  kiln::fuzz::expect_kiln_errors_only([&] { fast_ok = kiln::serving::decode_predict_fast(body, signatures(), &fast); });
  bool dom_ok = false;
  kiln::fuzz::expect_kiln_errors_only([&] {
    kiln::Json j = kiln::serving::parse_request_json(body, 64);
    kiln::fuzz::expect_kiln_errors_only([&] { kiln::serving::decode_kserve_infer(j); });
    kiln::serving::PredictCall dom = kiln::serving::decode_predict_request(j, signatures());
    dom_ok = true;
    if (fast_ok) expect_same(fast, dom);
  });
  if (fast_ok && !dom_ok) {
    fprintf(stderr, "the fast path accepted a body the DOM path refuses\n");
    abort();
  }
  return 0;
}
