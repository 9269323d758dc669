// String preprocessing before the model: StringLookup and TextVectorization
// with Keras 3's config keys, defaults and index layout.
//
// LibTorch has no string tensors, so these are not Layers (a kiln model
// takes tensors): they map std::vector<std::string> to int64 (or float
// encoding) tensors in the data pipeline, and the model starts at the ids
// (typically with an Embedding). Their configs round-trip through
// get_config() / the Json constructor, vocabulary included.
//
// StringLookup(max_tokens=null, num_oov_indices=1, mask_token=null,
//   oov_token="[UNK]", vocabulary=null, invert=false, output_mode="int",
//   pad_to_max_tokens=false, sparse=false, encoding="utf-8",
//   idf_weights=null): index layout [mask_token -> 0 if set (int mode)]
//   [num_oov_indices OOV ids] [vocabulary...]; an unknown token goes to OOV
//   id oov_start + Fingerprint64(token) % num_oov_indices (Keras's
//   to_hash_bucket_fast). adapt() learns the vocabulary by descending
//   frequency, ties by descending byte order (Keras's np.lexsort order).
//   Output modes "int", "one_hot", "multi_hot", "count" as IntegerLookup
//   (categorical.h); invert() maps ids back to tokens.
//
// TextVectorization(max_tokens=null, standardize="lower_and_strip_punctuation",
//   split="whitespace", ngrams=null, output_mode="int",
//   output_sequence_length=null, pad_to_max_tokens=false, vocabulary=null,
//   ...): standardize ("lower": ASCII lower-casing; "strip_punctuation":
//   removes Keras's punctuation set !"#$%&()*+,-./:;<=>?@[\]^_`{|}~' ;
//   "lower_and_strip_punctuation"; null), split ("whitespace" runs,
//   "character" (bytes), null), then a StringLookup with mask "" and OOV
//   "[UNK]" in int mode (ids 0 and 1; max_tokens counts them). "int"
//   returns (N, L) int64 padded with 0 to the longest text, or to / cut at
//   output_sequence_length; "multi_hot" / "count" return (N, depth) floats.
//   Unsupported (ValueError): ngrams, "tf_idf", ragged, sparse, callables.
//
//   TextVectorization tv(Json{{"max_tokens", 1000}, {"output_sequence_length", 8}});
//   tv.adapt({"The cat sat.", "The dog ran!"});
//   at::Tensor ids = tv({"the cat ran", "a bird"});   // (2, 8) int64
//
// Thread safety: adapt() must not race with lookups; lookups are const and
// may run concurrently.
#pragma once

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/ATen.h>

#include "kiln/core/json.h"
#include "kiln/core/shape.h"

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
};

class StringLookup {
 public:
  explicit StringLookup(const StringLookupOptions& options);
  explicit StringLookup(const Json& config = Json::object());
  // The config's keys as options; ValueError for an unknown key or a bad value.
  static StringLookupOptions options_from_config(const Json& config);

  // Replaces the vocabulary with the tokens of `data` (see above).
  void adapt(const std::vector<std::string>& data);
  // The same from token counts gathered elsewhere (e.g. batch by batch).
  void adapt_counts(const std::unordered_map<std::string, int64_t>& counts);
  void set_vocabulary(const std::vector<std::string>& vocabulary);

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
  Json get_config() const;

 private:
  friend class TextVectorization;
  int64_t oov_start() const;
  int64_t token_start() const;
  int64_t depth() const;
  StringLookupOptions options_;  // checked: the config (the vocabulary as set or adapted)
  std::unordered_map<std::string, int64_t> index_;
};

class TextVectorization {
 public:
  explicit TextVectorization(const Json& config = Json::object());

  void adapt(const std::vector<std::string>& texts);
  // (N, L) int64 ids, or (N, depth) floats in the encoding modes.
  at::Tensor operator()(const std::vector<std::string>& texts) const;
  // The tokens of one text after standardize and split.
  std::vector<std::string> tokenize(const std::string& text) const;
  std::vector<std::string> get_vocabulary(bool include_special_tokens = true) const {
    return lookup_.get_vocabulary(include_special_tokens);
  }
  int64_t vocabulary_size() const { return lookup_.vocabulary_size(); }
  Json get_config() const;

 private:
  Json config_;  // as given, minus the vocabulary
  std::optional<int64_t> max_tokens_;
  std::string standardize_, split_, output_mode_;
  std::optional<int64_t> sequence_length_;
  StringLookup lookup_;
};

}  // namespace layers

}  // namespace kiln

#define KILN_LEGACY_LAYERS_TEXT_PREPROCESSING_H
#include "kiln/layers/legacy_names.h"
