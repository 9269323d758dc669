// ONNX exporters of the string preprocessing layers: TextVectorization and
// StringLookup, from their get_config() only (the vocabulary is in it), so
// that any layer with these class names and Keras's config keys exports.
//
//   standardize "lower"       -> StringNormalizer (case_change_action LOWER,
//                                locale "C": A-Z only, as kiln)
//   split "whitespace"        -> StringSplit (opset 20) on each ASCII whitespace
//                                character, then the empty pieces dropped
//   vocabulary lookup         -> LabelEncoder (ai.onnx.ml): each token to its
//                                id, "" (the mask token, and the padding) to
//                                0, anything else to the one OOV id
//   output_sequence_length    -> Pad with 0, then Slice
//   "multi_hot" / "count"     -> OneHot, then ReduceSum (and Min with 1)
//
// What no ONNX operator computes is refused (LayerCall::refuse) with the
// setting and what to do instead: punctuation stripping (there is no regex
// replace, up to opset 28), split="character", n-grams, more than one OOV
// index (kiln hashes OOV tokens with FarmHash Fingerprint64).
#include <algorithm>
#include <set>

#include "kiln/export/onnx_graph.h"

namespace kiln::exporter::onnx {
namespace {

constexpr int64_t kMlOpset = 2;  // LabelEncoder's keys_strings / values_int64s / default_int64

// A string option that may be null (none); `fallback` when absent.
std::string option_or_none(const Json& cfg, const char* key, const char* fallback) {
  if (!cfg.contains(key)) return fallback;
  const Json& v = cfg.at(key);
  if (v.is_null()) return "";
  if (!v.is_string()) return "<" + v.dump() + ">";  // a callable's name or a bad value: refused below
  return v.get<std::string>();
}

// The learned tokens of a lookup's config: "vocabulary" without the special
// tokens Keras lets it start with (the mask token, then the OOV tokens).
std::vector<std::string> learned_vocabulary(LayerCall& c, const std::vector<std::string>& special) {
  const Json vocab = c.cfg.value("vocabulary", Json(nullptr));
  if (!vocab.is_array() || vocab.empty())
    c.refuse("has no vocabulary in its config; adapt() it or give one before exporting");
  std::vector<std::string> tokens;
  for (auto& t : vocab) {
    if (!t.is_string()) c.refuse("has a vocabulary with a non-string entry " + t.dump().substr(0, 40));
    tokens.push_back(t.get<std::string>());
  }
  size_t skip = 0;
  while (skip < special.size() && skip < tokens.size() && tokens[skip] == special[skip]) ++skip;
  if (skip == special.size()) tokens.erase(tokens.begin(), tokens.begin() + skip);
  return tokens;
}

// num_oov_indices as the graph can compute it: exactly one OOV id.
void check_one_oov_index(LayerCall& c, int64_t num_oov) {
  if (num_oov == 0)
    c.refuse(
        "has num_oov_indices=0, where kiln raises an error for an unknown token, which an ONNX graph cannot; "
        "export it with num_oov_indices=1");
  if (num_oov > 1)
    c.refuse("has num_oov_indices=" + std::to_string(num_oov) +
             ", which spreads unknown tokens over OOV ids by FarmHash Fingerprint64, which no ONNX operator "
             "computes; export it with num_oov_indices=1");
}

// tokens (strings) -> int64 ids: keys[i] -> values[i], anything else -> `unknown`.
std::string label_encoder(LayerCall& c, const std::string& tokens, const std::vector<std::string>& keys,
                          const std::vector<int64_t>& values, int64_t unknown) {
  std::string ids;
  auto* n = c.node("LabelEncoder", {tokens}, &ids, "_ids");
  n->set_domain("ai.onnx.ml");
  auto* k = n->add_attribute();
  k->set_name("keys_strings");
  k->set_type(kiln_onnx::AttributeProto::STRINGS);
  for (auto& key : keys) k->add_strings(key);
  GraphBuilder::attr(n, "values_int64s", values);
  GraphBuilder::attr(n, "default_int64", unknown);
  c.b.use_domain("ai.onnx.ml", kMlOpset);
  c.e.set_type(ids, at::kLong);
  return ids;
}

// kiln splits on runs of ASCII whitespace (isspace: space, \t, \n, \v, \f,
// \r). StringSplit without a delimiter splits on spaces only (ONNX Runtime
// 1.32), so the tokens (N, M) are split on each of the six in turn, rows
// flattened after each: (N, T) with "" where two separators met.
std::string split_on_whitespace(LayerCall& c, std::string tokens) {
  for (char sep : std::string(" \t\n\v\f\r")) {
    std::string pieces;
    auto* n = c.node("StringSplit", {tokens}, &pieces, "_split");
    GraphBuilder::attr(n, "delimiter", std::string(1, sep));
    n->add_output(c.b.fresh(c.base + "_piece_counts"));
    tokens = c.op("Reshape", {pieces, c.b.ints(c.base + "_rows", {0, -1})}, "_pieces");
  }
  return tokens;
}

// Ids (N, T) with 0 for the empty tokens between separators -> kiln's (N, L):
// each row's nonzero ids first in their order (TopK of id != 0 is stable:
// equal keys keep their order), cut to the longest row's count.
std::string drop_empty_tokens(LayerCall& c, const std::string& ids) {
  auto nonzero = c.cast(c.op("Not", {c.op("Equal", {ids, c.b.ints(c.base + "_zero", {0})}, "_is_empty")}, "_kept"),
                        kiln_onnx::TensorProto::INT64, "_kept_ids");
  auto width = c.slice(c.op("Shape", {ids}, "_shape"), {1}, {2}, {0}, "_width");
  std::string sorted, order = c.b.fresh(c.base + "_order");
  auto* n = c.node("TopK", {nonzero, width}, &sorted, "_sorted");
  n->add_output(order);
  GraphBuilder::attr(n, "axis", (int64_t)1);
  std::string packed;
  GraphBuilder::attr(c.node("GatherElements", {ids, order}, &packed, "_packed"), "axis", (int64_t)1);
  auto longest = c.reduce("ReduceMax", c.reduce("ReduceSum", nonzero, {1}, false, "_counts"), {0}, true, "_longest");
  return c.op("Slice", {packed, c.b.ints(c.base + "_start", {0}), longest, c.b.ints(c.base + "_axis", {1})}, "_ids");
}

}  // namespace

// TextVectorization: (N,) or (N, 1) strings -> (N, L) int64 ids ("int":
// mask "" = 0, OOV "[UNK]" = 1, the vocabulary from 2; L the longest text's
// token count, or output_sequence_length), or (N, depth) float32 counts
// ("multi_hot", "count": OOV = 0, the vocabulary from 1).
std::vector<std::string> export_text_vectorization(LayerCall& c) {
  const std::string standardize = option_or_none(c.cfg, "standardize", "lower_and_strip_punctuation");
  const std::string split = option_or_none(c.cfg, "split", "whitespace");
  const std::string mode = c.cfg.value("output_mode", "int");
  if (standardize == "lower_and_strip_punctuation" || standardize == "strip_punctuation")
    c.refuse("has standardize=\"" + standardize +
             "\": ONNX has no regular-expression replace (up to opset 28) to strip punctuation; export it with "
             "standardize=\"lower\" (or null) and strip punctuation before the model");
  if (!standardize.empty() && standardize != "lower")
    c.refuse("has standardize=" + standardize + ", which has no ONNX form; use \"lower\" or null");
  if (split == "character")
    c.refuse(
        "has split=\"character\": ONNX has no operator that splits a string into characters; export it with "
        "split=\"whitespace\" (or null), or split into characters before the model");
  if (!split.empty() && split != "whitespace")
    c.refuse("has split=" + split + ", which has no ONNX form; use \"whitespace\" or null");
  if (c.cfg.contains("ngrams") && !c.cfg.at("ngrams").is_null())
    c.refuse("has ngrams=" + c.cfg.at("ngrams").dump() +
             ", which kiln's exporter does not write; export it with ngrams=null");
  if (mode != "int" && mode != "multi_hot" && mode != "count")
    c.refuse("has output_mode=\"" + mode + "\", which has no ONNX export; use \"int\", \"multi_hot\" or \"count\"");
  const Shape& s = c.input_shape();
  if (s.size() > 2 || (s.size() == 2 && s[1] != 1))
    c.refuse("takes strings of shape " + shape_to_string(s) + "; the export takes (batch,) or (batch, 1)");

  const bool int_mode = mode == "int";
  const std::vector<std::string> vocab =
      learned_vocabulary(c, int_mode ? std::vector<std::string>{"", "[UNK]"} : std::vector<std::string>{"[UNK]"});
  // Ids: int mode [""] [OOV] [vocabulary]; encodings [OOV] [vocabulary], "" dropped.
  const int64_t oov = int_mode ? 1 : 0, first = oov + 1;
  const int64_t vocab_size = first + (int64_t)vocab.size();
  int64_t depth = vocab_size;
  if (!int_mode && c.cfg.value("pad_to_max_tokens", false) && c.cfg.contains("max_tokens") &&
      c.cfg.at("max_tokens").is_number_integer())
    depth = std::max(depth, c.cfg.at("max_tokens").get<int64_t>());

  std::string x = c.op("Reshape", {c.x(), c.b.ints(c.base + "_flat", {-1})}, "_texts");  // (N,)
  if (standardize == "lower") {
    std::string lower;
    auto* n = c.node("StringNormalizer", {x}, &lower, "_lower");
    GraphBuilder::attr(n, "case_change_action", std::string("LOWER"));
    // The "C" locale lower-cases A-Z only, as kiln (onnxruntime-web lowers
    // beyond ASCII in any locale); it is on every system, unlike the default
    // en_US.UTF-8, without which ONNX Runtime refuses the model.
    GraphBuilder::attr(n, "locale", std::string("C"));
    x = lower;
  }
  std::string tokens = c.unsqueeze(x, {1}, "_tokens");  // (N, 1): the whole text is the token
  if (split == "whitespace") tokens = split_on_whitespace(c, tokens);

  std::vector<std::string> keys;
  std::vector<int64_t> values;
  // The padding StringSplit adds; in int mode also the mask token.
  const bool drop_empty = int_mode || split == "whitespace";
  if (drop_empty) {
    keys.push_back("");
    values.push_back(int_mode ? 0 : depth);  // depth: OneHot's all-zero row
  }
  std::set<std::string> seen(keys.begin(), keys.end());
  for (size_t i = 0; i < vocab.size(); ++i) {
    if (!seen.insert(vocab[i]).second) continue;  // "" or a repeat: kiln's set_vocabulary refuses both
    keys.push_back(vocab[i]);
    values.push_back(first + (int64_t)i);
  }
  std::string ids = label_encoder(c, tokens, keys, values, oov);
  if (int_mode && split == "whitespace") ids = drop_empty_tokens(c, ids);

  if (!int_mode) return {encode_ids(c, ids, depth, mode)};
  const Json length = c.cfg.value("output_sequence_length", Json(nullptr));
  if (length.is_number_integer()) {
    const int64_t l = length.get<int64_t>();
    ids = c.op("Pad", {ids, c.b.ints(c.base + "_pads", {0, 0, 0, l})}, "_padded");
    ids = c.slice(ids, {0}, {l}, {1}, "_cut");
  }
  c.e.set_type(ids, at::kLong);
  return {ids};
}

// StringLookup with output_mode "int": strings of any shape -> int64 ids of
// that shape ([mask_token = 0] [the OOV id] [vocabulary]).
std::vector<std::string> export_string_lookup(LayerCall& c) {
  if (c.cfg.value("invert", false) || c.cfg.value("output_mode", "int") != "int")
    c.refuse("exports with output_mode \"int\" and invert=false only; encode its ids with a CategoryEncoding layer");
  const int64_t num_oov = c.cfg.value("num_oov_indices", (int64_t)1);
  check_one_oov_index(c, num_oov);
  const Json mask = c.cfg.value("mask_token", Json(nullptr));
  const std::string oov_token = c.cfg.value("oov_token", "[UNK]");
  std::vector<std::string> special;
  if (mask.is_string()) special.push_back(mask.get<std::string>());
  special.push_back(oov_token);
  const std::vector<std::string> vocab = learned_vocabulary(c, special);
  const int64_t oov = mask.is_string() ? 1 : 0, first = oov + num_oov;
  std::vector<std::string> keys;
  std::vector<int64_t> values;
  if (mask.is_string()) {
    keys.push_back(mask.get<std::string>());
    values.push_back(0);
  }
  std::set<std::string> seen(keys.begin(), keys.end());
  for (size_t i = 0; i < vocab.size(); ++i) {
    if (!seen.insert(vocab[i]).second) continue;
    keys.push_back(vocab[i]);
    values.push_back(first + (int64_t)i);
  }
  return {label_encoder(c, c.x(), keys, values, oov)};
}

}  // namespace kiln::exporter::onnx
