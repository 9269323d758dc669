// String preprocessing layers: StringLookup and TextVectorization with Keras
// 3's config keys, defaults and index layout. They take string tensors
// (kiln/core/string_tensor.h: a uint8 tensor S + [4 + W]) inside a model,
// after an Input(shape, kStringDType), and compute on the CPU whatever the
// dtype policy: their outputs are int64 ids or float32 encodings, never cast
// by mixed precision. The same semantics are reachable on
// std::vector<std::string> (operator(), adapt, tokenize) for a data pipeline.
// Their configs round-trip through get_config() / the Json constructor with
// the vocabulary inside (so a saved model directory holds it in model.json).
//
// StringLookup(max_tokens=null, num_oov_indices=1, mask_token=null,
//   oov_token="[UNK]", vocabulary=null, invert=false, output_mode="int",
//   pad_to_max_tokens=false, sparse=false, encoding="utf-8",
//   idf_weights=null): index layout [mask_token -> 0 if set (int mode)]
//   [num_oov_indices OOV ids] [vocabulary...]; an unknown token goes to OOV
//   id oov_start + Fingerprint64(token) % num_oov_indices (Keras's
//   to_hash_bucket_fast). adapt() learns the vocabulary by descending
//   frequency, ties by descending byte order (Keras's np.lexsort order).
//   Output modes "int" (int64 ids of the input's logical shape), "one_hot",
//   "multi_hot", "count" (float32, as IntegerLookup in categorical.h);
//   invert=true takes int ids and gives a string tensor back.
//
// TextVectorization(max_tokens=null, standardize="lower_and_strip_punctuation",
//   split="whitespace", ngrams=null, output_mode="int",
//   output_sequence_length=null, pad_to_max_tokens=false, vocabulary=null,
//   ...): standardize ("lower": ASCII lower-casing; "strip_punctuation":
//   removes Keras's punctuation set !"#$%&()*+,-./:;<=>?@[\]^_`{|}~' ;
//   "lower_and_strip_punctuation"; null), split ("whitespace" runs,
//   "character" (bytes), null), ngrams (n: the 1..n-grams; [a, b, ...]:
//   those widths; n-grams joined by a space, all of the first width, then
//   the next, as tf.strings.ngrams), then a StringLookup with mask "" and
//   OOV "[UNK]" in int mode (ids 0 and 1; max_tokens counts them). Input:
//   strings of logical shape (N,) or (N, 1). "int" returns (N, L) int64
//   padded with 0 to the longest text, or to / cut at
//   output_sequence_length; "multi_hot" / "count" return (N, depth) float32.
//   Unsupported (ValueError): "tf_idf", ragged, sparse, callables. Adapt
//   before building a model on an encoding mode: depth is the vocabulary's
//   size when the graph is traced (as in Keras).
//
//   auto tv = layers::TextVectorization(Json{{"max_tokens", 1000}, {"output_sequence_length", 8}});
//   tv->adapt({"The cat sat.", "The dog ran!"});
//   at::Tensor ids = tv(strings::encode({"the cat ran", "a bird"}));   // (2, 8) int64
//   auto model = models::Functional(layers::Input({}, kStringDType), ...);   // or inside a model
//
// Thread safety: adapt() must not race with calls; calls are read-only and
// may run concurrently.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/ATen.h>

#include "kiln/core/json.h"
#include "kiln/core/shape.h"
#include "kiln/core/string_tensor.h"
#include "kiln/layers/layer.h"
#include "kiln/layers/layer_holder.h"
#include "kiln/layers/layer_options.h"

namespace kiln {

namespace layers {

struct StringLookupOptions {
  std::optional<int64_t> max_tokens;  // null: no limit; else > 1, reserved ids included
  int64_t num_oov_indices = 1;        // >= 0
  std::optional<std::string> mask_token;
  std::string oov_token = "[UNK]";
  std::vector<std::string> vocabulary;  // learned ones only; adapt() replaces it
  bool invert = false;                  // only with output_mode "int"
  std::string output_mode = "int";      // "int", "one_hot", "multi_hot", "count"
  bool pad_to_max_tokens = false;       // only with max_tokens
  bool sparse = false;                  // false only (kiln has no sparse tensors)
  std::string encoding = "utf-8";       // "utf-8" only
  LayerOptions base;
};

class StringLookupImpl : public SimpleLayer {
 public:
  explicit StringLookupImpl(const StringLookupOptions& options);
  explicit StringLookupImpl(const Json& config = Json::object());
  // The config's keys as options; ValueError for an unknown key or a bad value.
  static StringLookupOptions options_from_config(const Json& config);

  std::string class_name() const override { return "StringLookup"; }
  // A string tensor -> ids or encodings (invert: int ids -> a string tensor).
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  std::vector<at::ScalarType> compute_output_dtype(const std::vector<at::ScalarType>& in) override;
  bool autocast() const override { return false; }
  Json get_config() const override;

  // Replaces the vocabulary with the tokens of `data` (see above): strings,
  // a string tensor, or string tensors batch by batch until next_batch()
  // returns an undefined tensor (kiln/data/adapt.h adapts from a Dataset).
  void adapt(const std::vector<std::string>& data);
  void adapt(const at::Tensor& data);
  void adapt(const std::function<at::Tensor()>& next_batch);
  // The same from token counts gathered elsewhere.
  void adapt_counts(const std::unordered_map<std::string, int64_t>& counts);
  void set_vocabulary(const std::vector<std::string>& vocabulary);

  // The layer's tensors and KerasTensors, and, on std::vector<std::string>:
  using SimpleLayer::operator();
  // Ids of `tokens` as an int64 tensor shaped `shape` (default (n,)), or,
  // in the encoding modes, their (N, depth) encoding (rows of `shape`).
  at::Tensor operator()(const std::vector<std::string>& tokens, const Shape& shape = {}) const;
  // The id of one token (int mode layout); -1 for the mask token in the
  // encoding modes (dropped).
  int64_t index_of(const std::string& token) const;
  // invert=true: ids -> tokens (row-major).
  std::vector<std::string> invert(const at::Tensor& ids) const;

  // Keras's get_vocabulary(): special tokens first, then the learned ones.
  std::vector<std::string> get_vocabulary(bool include_special_tokens = true) const;
  int64_t vocabulary_size() const;

 private:
  friend class TextVectorizationImpl;
  StringLookupImpl(const StringLookupOptions& options, const Json& base_config);
  int64_t oov_start() const;
  int64_t token_start() const;
  int64_t depth() const;
  StringLookupOptions options_;  // checked: the config (the vocabulary as set or adapted)
  std::unordered_map<std::string, int64_t> index_;
};
KILN_LAYER_HOLDER(StringLookup, StringLookupOptions);

class TextVectorizationImpl : public SimpleLayer {
 public:
  explicit TextVectorizationImpl(const Json& config = Json::object());

  std::string class_name() const override { return "TextVectorization"; }
  // A string tensor of logical shape (N,) or (N, 1) -> as operator() below.
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  std::vector<at::ScalarType> compute_output_dtype(const std::vector<at::ScalarType>& in) override;
  bool autocast() const override { return false; }
  // The config as given (and the base keys), with the vocabulary.
  Json get_config() const override;

  // As StringLookupImpl::adapt, on the tokens of each text.
  void adapt(const std::vector<std::string>& texts);
  void adapt(const at::Tensor& texts);
  void adapt(const std::function<at::Tensor()>& next_batch);

  using SimpleLayer::operator();
  // (N, L) int64 ids, or (N, depth) floats in the encoding modes.
  at::Tensor operator()(const std::vector<std::string>& texts) const;
  // The tokens of one text after standardize, split and ngrams.
  std::vector<std::string> tokenize(const std::string& text) const;
  std::vector<std::string> get_vocabulary(bool include_special_tokens = true) const {
    return lookup_.get_vocabulary(include_special_tokens);
  }
  int64_t vocabulary_size() const { return lookup_.vocabulary_size(); }

 private:
  Json config_;  // as given, minus the vocabulary
  std::optional<int64_t> max_tokens_;
  std::string standardize_, split_, output_mode_;
  std::optional<int64_t> sequence_length_;
  std::vector<int64_t> ngrams_;  // widths; empty: tokens as split
  StringLookupImpl lookup_;
};
KILN_LAYER_HOLDER(TextVectorization, void);

}  // namespace layers

}  // namespace kiln

#define KILN_LEGACY_LAYERS_TEXT_PREPROCESSING_H
#include "kiln/layers/legacy_names.h"
