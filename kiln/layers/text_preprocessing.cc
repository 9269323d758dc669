#include "kiln/layers/text_preprocessing.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "kiln/layers/categorical.h"
#include "kiln/layers/config_reader.h"
#include "kiln/layers/string_hash.h"

namespace kiln {
namespace {

const char kTextPunctuation[] = "!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~'";

}  // namespace

// --- StringLookup ---------------------------------------------------------------
StringLookup::StringLookup(const Json& config) {
  ConfigReader r(config, "StringLookup");
  for (const char* base : {"name", "trainable", "dtype"}) r.get(base);
  if (r.has("max_tokens")) {
    max_tokens_ = r.positive_int("max_tokens");
    if (*max_tokens_ < 2) r.invalid("max_tokens", "null or an integer greater than 1");
  } else {
    r.get("max_tokens");
  }
  num_oov_ = r.integer("num_oov_indices", 1);
  if (num_oov_ < 0) r.invalid("num_oov_indices", "a non-negative integer");
  if (const Json* m = r.get("mask_token")) {
    if (!m->is_string()) r.invalid("mask_token", "null or a string");
    mask_token_ = m->get<std::string>();
  }
  oov_token_ = r.string("oov_token", "[UNK]");
  if (r.get("idf_weights")) r.invalid("idf_weights", "null (no \"tf_idf\" output mode)");
  invert_ = r.boolean("invert", false);
  output_mode_ = r.choice("output_mode", "int", {"int", "one_hot", "multi_hot", "count"});
  pad_to_max_tokens_ = r.boolean("pad_to_max_tokens", false);
  if (r.boolean("sparse", false)) r.invalid("sparse", "false (kiln has no sparse tensors)");
  r.choice("encoding", "utf-8", {"utf-8"});
  if (invert_ && output_mode_ != "int") r.invalid("invert", "false unless output_mode is \"int\"");
  if (pad_to_max_tokens_ && !max_tokens_) r.invalid("pad_to_max_tokens", "false unless max_tokens is set");
  std::vector<std::string> vocab;
  if (const Json* v = r.get("vocabulary")) {
    if (!v->is_array()) r.invalid("vocabulary", "null or a list of strings (vocabulary files are not supported)");
    for (auto& e : *v) {
      if (!e.is_string()) r.invalid("vocabulary", "a list of strings");
      vocab.push_back(e.get<std::string>());
    }
  }
  r.finish();
  set_vocabulary(vocab);
}

int64_t StringLookup::oov_start() const { return mask_token_ && output_mode_ == "int" ? 1 : 0; }
int64_t StringLookup::token_start() const { return oov_start() + num_oov_; }
int64_t StringLookup::vocabulary_size() const { return token_start() + (int64_t)vocabulary_.size(); }
int64_t StringLookup::depth() const {
  return pad_to_max_tokens_ ? std::max(*max_tokens_, vocabulary_size()) : vocabulary_size();
}

void StringLookup::set_vocabulary(const std::vector<std::string>& vocabulary) {
  std::unordered_map<std::string, int64_t> index;
  for (size_t i = 0; i < vocabulary.size(); ++i) {
    const std::string& t = vocabulary[i];
    if ((mask_token_ && t == *mask_token_) || t == oov_token_)
      throw ValueError(
          "StringLookup: the vocabulary must not contain the mask token or the OOV token (they have "
          "reserved ids). Received '" +
          t.substr(0, 40) + "' at position " + std::to_string(i));
    if (!index.emplace(t, (int64_t)i).second)
      throw ValueError("StringLookup: the vocabulary has repeated token '" + t.substr(0, 40) + "'");
  }
  if (max_tokens_ && token_start() + (int64_t)vocabulary.size() > *max_tokens_)
    throw ValueError("StringLookup: a vocabulary of " + std::to_string(vocabulary.size()) + " tokens plus " +
                     std::to_string(token_start()) +
                     " reserved ids exceeds max_tokens=" + std::to_string(*max_tokens_));
  vocabulary_ = vocabulary;
  index_ = std::move(index);
}

void StringLookup::adapt(const std::vector<std::string>& data) {
  std::unordered_map<std::string, int64_t> counts;
  for (auto& s : data) ++counts[s];
  adapt_counts(counts);
}

void StringLookup::adapt_counts(const std::unordered_map<std::string, int64_t>& counts_in) {
  std::vector<std::pair<std::string, int64_t>> order;
  for (auto& [token, n] : counts_in)
    if (!(mask_token_ && token == *mask_token_) && token != oov_token_) order.emplace_back(token, n);
  // Keras: np.lexsort((tokens, counts))[::-1] -> count descending, then token descending.
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first > b.first;
  });
  if (max_tokens_) {
    const int64_t room = std::max<int64_t>(*max_tokens_ - token_start(), 0);
    if ((int64_t)order.size() > room) order.resize(room);
  }
  std::vector<std::string> vocab;
  for (auto& [token, n] : order) vocab.push_back(token);
  set_vocabulary(vocab);
}

int64_t StringLookup::index_of(const std::string& token) const {
  if (mask_token_ && token == *mask_token_) return output_mode_ == "int" ? 0 : -1;
  auto it = index_.find(token);
  if (it != index_.end()) return token_start() + it->second;
  if (num_oov_ == 0)
    throw ValueError("StringLookup: token '" + token.substr(0, 40) +
                     "' is not in the vocabulary and num_oov_indices=0; set num_oov_indices >= 1");
  return oov_start() + (num_oov_ == 1 ? 0 : (int64_t)(fingerprint64(token) % (uint64_t)num_oov_));
}

at::Tensor StringLookup::operator()(const std::vector<std::string>& tokens, const Shape& shape) const {
  if (invert_) throw ValueError("StringLookup: invert=true maps ids to strings; call invert(ids)");
  Shape s = shape.empty() ? Shape{(int64_t)tokens.size()} : shape;
  if (num_elements(s) != (int64_t)tokens.size())
    throw ShapeError("StringLookup: " + std::to_string(tokens.size()) + " tokens do not fill shape " +
                     shape_to_string(s));
  std::vector<int64_t> ids;
  ids.reserve(tokens.size());
  bool any_dropped = false;
  for (auto& t : tokens) {
    ids.push_back(index_of(t));
    any_dropped |= ids.back() < 0;
  }
  at::Tensor out = at::tensor(ids, at::kLong).reshape(s);
  if (output_mode_ == "int") return out;
  at::Tensor drop = any_dropped ? out < 0 : at::Tensor();
  return encode_categorical(at::clamp_min(out, 0), depth(), output_mode_, at::kFloat, "StringLookup", drop);
}

std::vector<std::string> StringLookup::invert(const at::Tensor& ids_in) const {
  at::Tensor ids = ids_in.to(at::kLong).contiguous().reshape(-1);
  std::vector<std::string> out;
  const int64_t* p = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int64_t k = p[i] - token_start();
    if (mask_token_ && p[i] == 0)
      out.push_back(*mask_token_);
    else
      out.push_back(k >= 0 && k < (int64_t)vocabulary_.size() ? vocabulary_[k] : oov_token_);
  }
  return out;
}

std::vector<std::string> StringLookup::get_vocabulary(bool include_special_tokens) const {
  std::vector<std::string> out;
  if (include_special_tokens) {
    if (mask_token_ && output_mode_ == "int") out.push_back(*mask_token_);
    for (int64_t i = 0; i < num_oov_; ++i) out.push_back(oov_token_);
  }
  out.insert(out.end(), vocabulary_.begin(), vocabulary_.end());
  return out;
}

Json StringLookup::get_config() const {
  Json j;
  j["max_tokens"] = max_tokens_ ? Json(*max_tokens_) : Json(nullptr);
  j["num_oov_indices"] = num_oov_;
  j["mask_token"] = mask_token_ ? Json(*mask_token_) : Json(nullptr);
  j["oov_token"] = oov_token_;
  j["vocabulary"] = vocabulary_.empty() ? Json(nullptr) : Json(vocabulary_);
  j["idf_weights"] = nullptr;
  j["invert"] = invert_;
  j["output_mode"] = output_mode_;
  j["pad_to_max_tokens"] = pad_to_max_tokens_;
  j["sparse"] = false;
  j["encoding"] = "utf-8";
  return j;
}

// --- TextVectorization --------------------------------------------------------------
namespace {
Json text_lookup_config(const Json& config) {
  ConfigReader r(config, "TextVectorization");
  for (const char* base : {"name", "trainable", "dtype"}) r.get(base);
  Json lookup;
  const std::string mode = r.choice("output_mode", "int", {"int", "multi_hot", "count"});
  lookup["output_mode"] = mode;
  lookup["mask_token"] = mode == "int" ? Json("") : Json(nullptr);
  lookup["oov_token"] = "[UNK]";
  if (const Json* m = r.get("max_tokens")) lookup["max_tokens"] = *m;
  lookup["pad_to_max_tokens"] = r.boolean("pad_to_max_tokens", false);
  if (const Json* v = r.get("vocabulary")) lookup["vocabulary"] = *v;
  r.choice("standardize", "lower_and_strip_punctuation", {"lower_and_strip_punctuation", "lower", "strip_punctuation"});
  r.choice("split", "whitespace", {"whitespace", "character"});
  if (r.get("ngrams")) r.invalid("ngrams", "null (n-grams are not supported)");
  if (const Json* n = r.get("output_sequence_length")) {
    if (!n->is_number_integer() || n->get<int64_t>() < 1)
      r.invalid("output_sequence_length", "null or a positive integer");
    if (mode != "int") r.invalid("output_sequence_length", "null unless output_mode is \"int\"");
  }
  if (r.get("idf_weights")) r.invalid("idf_weights", "null (no \"tf_idf\" output mode)");
  if (r.boolean("ragged", false)) r.invalid("ragged", "false (kiln has no ragged tensors)");
  if (r.boolean("sparse", false)) r.invalid("sparse", "false (kiln has no sparse tensors)");
  r.choice("encoding", "utf-8", {"utf-8"});
  r.finish();
  return lookup;
}
}  // namespace

TextVectorization::TextVectorization(const Json& config) : lookup_(text_lookup_config(config)) {
  config_ = config.is_object() ? config : Json::object();
  config_.erase("vocabulary");
  // standardize/split may be given as null (none): ConfigReader treats null as absent.
  auto str_or_none = [&](const char* key, const char* fallback) -> std::string {
    if (config_.contains(key) && config_[key].is_null()) return "";
    return config_.value(key, fallback);
  };
  standardize_ = str_or_none("standardize", "lower_and_strip_punctuation");
  split_ = str_or_none("split", "whitespace");
  output_mode_ = config_.value("output_mode", "int");
  if (config_.contains("output_sequence_length") && !config_["output_sequence_length"].is_null())
    sequence_length_ = config_["output_sequence_length"].get<int64_t>();
}

std::vector<std::string> TextVectorization::tokenize(const std::string& text) const {
  std::string s;
  s.reserve(text.size());
  const bool lower = standardize_ == "lower" || standardize_ == "lower_and_strip_punctuation";
  const bool strip = standardize_ == "strip_punctuation" || standardize_ == "lower_and_strip_punctuation";
  for (char ch : text) {
    if (strip && std::strchr(kTextPunctuation, ch) && ch != '\0') continue;
    s.push_back(lower ? (char)std::tolower((unsigned char)ch) : ch);
  }
  std::vector<std::string> out;
  if (split_ == "whitespace") {
    std::string cur;
    for (char ch : s) {
      if (std::isspace((unsigned char)ch)) {
        if (!cur.empty()) out.push_back(cur);
        cur.clear();
      } else {
        cur.push_back(ch);
      }
    }
    if (!cur.empty()) out.push_back(cur);
  } else if (split_ == "character") {
    for (char ch : s) out.emplace_back(1, ch);
  } else {
    out.push_back(s);
  }
  return out;
}

void TextVectorization::adapt(const std::vector<std::string>& texts) {
  std::unordered_map<std::string, int64_t> counts;
  for (auto& t : texts)
    for (auto& tok : tokenize(t)) ++counts[tok];
  lookup_.adapt_counts(counts);
}

at::Tensor TextVectorization::operator()(const std::vector<std::string>& texts) const {
  std::vector<std::vector<std::string>> tokens;
  size_t longest = 0;
  for (auto& t : texts) {
    tokens.push_back(tokenize(t));
    longest = std::max(longest, tokens.back().size());
  }
  const int64_t n = (int64_t)texts.size();
  if (output_mode_ != "int") {
    const int64_t depth = lookup_.depth();
    at::Tensor out = at::zeros({n, depth}, at::kFloat);
    auto acc = out.accessor<float, 2>();
    for (int64_t i = 0; i < n; ++i)
      for (auto& tok : tokens[i]) {
        const int64_t id = lookup_.index_of(tok);
        if (id < 0) continue;
        acc[i][id] = output_mode_ == "count" ? acc[i][id] + 1 : 1;
      }
    return out;
  }
  const int64_t len = sequence_length_ ? *sequence_length_ : (int64_t)longest;
  at::Tensor out = at::zeros({n, len}, at::kLong);
  auto acc = out.accessor<int64_t, 2>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < len && j < (int64_t)tokens[i].size(); ++j) acc[i][j] = lookup_.index_of(tokens[i][j]);
  return out;
}

Json TextVectorization::get_config() const {
  Json j = config_;
  j["vocabulary"] = lookup_.vocabulary_.empty() ? Json(nullptr) : Json(lookup_.vocabulary_);
  return j;
}

}  // namespace kiln
