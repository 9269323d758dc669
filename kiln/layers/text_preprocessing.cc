#include "kiln/layers/text_preprocessing.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "kiln/layers/categorical.h"
#include "kiln/layers/config_fields.h"
#include "kiln/layers/string_hash.h"

namespace kiln {
namespace {

const char kTextPunctuation[] = "!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~'";

// A batch source that yields `t` once.
std::function<at::Tensor()> one_batch(const at::Tensor& t) {
  auto given = std::make_shared<bool>(false);
  return [t, given]() -> at::Tensor {
    if (*given) return at::Tensor();
    *given = true;
    return t;
  };
}

// Calls `f` on every string of every batch next_batch() gives.
void for_each_string(const std::function<at::Tensor()>& next_batch, const std::string& owner,
                     const std::function<void(const std::string&)>& f) {
  for (at::Tensor batch = next_batch(); batch.defined(); batch = next_batch())
    for (auto& s : string_input(batch, owner)) f(s);
}

// A key kiln accepts only as null, written as null.
template <class O>
FieldDef<O> null_only(const char* key, const char* expected) {
  return FieldDef<O>{key,
                     [=](ConfigReader& r, O&) {
                       if (r.get(key)) r.invalid(key, expected);
                     },
                     nullptr, [=](Json& j, const O&) { j[key] = nullptr; }};
}

const FieldTable<layers::StringLookupOptions>& string_lookup_fields() {
  using O = layers::StringLookupOptions;
  static const FieldTable<O> t = [] {
    FieldDef<O> max_tokens{"max_tokens",
                           [](ConfigReader& r, O& o) {
                             if (!r.get("max_tokens")) return;
                             o.max_tokens = r.positive_int("max_tokens");
                             if (*o.max_tokens < 2) r.invalid("max_tokens", "null or an integer greater than 1");
                           },
                           [](const std::string& owner, O& o) {
                             if (o.max_tokens && (*o.max_tokens < 2 || *o.max_tokens > kMaxConfigDim))
                               option_check::invalid(owner, "max_tokens", "null or an integer greater than 1",
                                                     *o.max_tokens);
                           },
                           [](Json& j, const O& o) { j["max_tokens"] = o.max_tokens ? Json(*o.max_tokens) : Json(); }};
    FieldDef<O> mask_token{"mask_token",
                           [](ConfigReader& r, O& o) {
                             const Json* m = r.get("mask_token");
                             if (m && !m->is_string()) r.invalid("mask_token", "null or a string");
                             if (m) o.mask_token = m->get<std::string>();
                           },
                           nullptr,
                           [](Json& j, const O& o) { j["mask_token"] = o.mask_token ? Json(*o.mask_token) : Json(); }};
    FieldDef<O> vocabulary{
        "vocabulary",
        [](ConfigReader& r, O& o) {
          const Json* v = r.get("vocabulary");
          if (!v) return;
          if (!v->is_array()) r.invalid("vocabulary", "null or a list of strings (vocabulary files are not supported)");
          o.vocabulary.clear();
          for (auto& e : *v) {
            if (!e.is_string()) r.invalid("vocabulary", "a list of strings");
            o.vocabulary.push_back(e.get<std::string>());
          }
        },
        nullptr, [](Json& j, const O& o) { j["vocabulary"] = o.vocabulary.empty() ? Json() : Json(o.vocabulary); }};
    return FieldTable<O>{
        max_tokens,
        field("num_oov_indices", &O::num_oov_indices).where([](int64_t n) { return n >= 0; }, "a non-negative integer"),
        mask_token,
        field("oov_token", &O::oov_token),
        vocabulary,
        null_only<O>("idf_weights", "null (no \"tf_idf\" output mode)"),
        field("invert", &O::invert),
        field("output_mode", &O::output_mode).choice({"int", "one_hot", "multi_hot", "count"}),
        field("pad_to_max_tokens", &O::pad_to_max_tokens),
        field("sparse", &O::sparse).where([](bool b) { return !b; }, "false (kiln has no sparse tensors)"),
        field("encoding", &O::encoding).choice({"utf-8"})};
  }();
  return t;
}

}  // namespace

// --- StringLookup ---------------------------------------------------------------
layers::StringLookupOptions layers::StringLookupImpl::options_from_config(const Json& config) {
  return read_fields(config, "StringLookup", string_lookup_fields());
}

layers::StringLookupImpl::StringLookupImpl(const Json& config)
    : layers::StringLookupImpl(options_from_config(config), config) {}

layers::StringLookupImpl::StringLookupImpl(const layers::StringLookupOptions& o)
    : layers::StringLookupImpl(o, layer_base_config(o.base)) {}

layers::StringLookupImpl::StringLookupImpl(const layers::StringLookupOptions& o, const Json& base_config)
    : SimpleLayer(base_config), options_(o) {
  check_fields("StringLookup", options_, string_lookup_fields());
  if (options_.invert && options_.output_mode != "int")
    option_check::invalid("StringLookup", "invert", "false unless output_mode is \"int\"", true);
  if (options_.pad_to_max_tokens && !options_.max_tokens)
    option_check::invalid("StringLookup", "pad_to_max_tokens", "false unless max_tokens is set", true);
  set_vocabulary(options_.vocabulary);
}

int64_t layers::StringLookupImpl::oov_start() const {
  return options_.mask_token && options_.output_mode == "int" ? 1 : 0;
}
int64_t layers::StringLookupImpl::token_start() const { return oov_start() + options_.num_oov_indices; }
int64_t layers::StringLookupImpl::vocabulary_size() const {
  return token_start() + (int64_t)options_.vocabulary.size();
}
int64_t layers::StringLookupImpl::depth() const {
  return options_.pad_to_max_tokens ? std::max(*options_.max_tokens, vocabulary_size()) : vocabulary_size();
}

void layers::StringLookupImpl::set_vocabulary(const std::vector<std::string>& vocabulary) {
  std::unordered_map<std::string, int64_t> index;
  for (size_t i = 0; i < vocabulary.size(); ++i) {
    const std::string& t = vocabulary[i];
    if ((options_.mask_token && t == *options_.mask_token) || t == options_.oov_token)
      throw ValueError(
          "StringLookup: the vocabulary must not contain the mask token or the OOV token (they have "
          "reserved ids). Received '" +
          t.substr(0, 40) + "' at position " + std::to_string(i));
    if (!index.emplace(t, (int64_t)i).second)
      throw ValueError("StringLookup: the vocabulary has repeated token '" + t.substr(0, 40) + "'");
  }
  if (options_.max_tokens && token_start() + (int64_t)vocabulary.size() > *options_.max_tokens)
    throw ValueError("StringLookup: a vocabulary of " + std::to_string(vocabulary.size()) + " tokens plus " +
                     std::to_string(token_start()) +
                     " reserved ids exceeds max_tokens=" + std::to_string(*options_.max_tokens));
  options_.vocabulary = vocabulary;
  index_ = std::move(index);
}

void layers::StringLookupImpl::adapt(const std::vector<std::string>& data) {
  std::unordered_map<std::string, int64_t> counts;
  for (auto& s : data) ++counts[s];
  adapt_counts(counts);
}

void layers::StringLookupImpl::adapt(const at::Tensor& data) { adapt(one_batch(data)); }

void layers::StringLookupImpl::adapt(const std::function<at::Tensor()>& next_batch) {
  std::unordered_map<std::string, int64_t> counts;
  for_each_string(next_batch, "StringLookup '" + name() + "': adapt", [&](const std::string& s) { ++counts[s]; });
  adapt_counts(counts);
}

void layers::StringLookupImpl::adapt_counts(const std::unordered_map<std::string, int64_t>& counts_in) {
  std::vector<std::pair<std::string, int64_t>> order;
  for (auto& [token, n] : counts_in)
    if (!(options_.mask_token && token == *options_.mask_token) && token != options_.oov_token)
      order.emplace_back(token, n);
  // Keras: np.lexsort((tokens, counts))[::-1] -> count descending, then token descending.
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first > b.first;
  });
  if (options_.max_tokens) {
    const int64_t room = std::max<int64_t>(*options_.max_tokens - token_start(), 0);
    if ((int64_t)order.size() > room) order.resize(room);
  }
  std::vector<std::string> vocab;
  for (auto& [token, n] : order) vocab.push_back(token);
  set_vocabulary(vocab);
}

int64_t layers::StringLookupImpl::index_of(const std::string& token) const {
  if (options_.mask_token && token == *options_.mask_token) return options_.output_mode == "int" ? 0 : -1;
  auto it = index_.find(token);
  if (it != index_.end()) return token_start() + it->second;
  if (options_.num_oov_indices == 0)
    throw ValueError("StringLookup: token '" + token.substr(0, 40) +
                     "' is not in the vocabulary and num_oov_indices=0; set num_oov_indices >= 1");
  return oov_start() +
         (options_.num_oov_indices == 1 ? 0 : (int64_t)(fingerprint64(token) % (uint64_t)options_.num_oov_indices));
}

at::Tensor layers::StringLookupImpl::operator()(const std::vector<std::string>& tokens, const Shape& shape) const {
  if (options_.invert) throw ValueError("StringLookup: invert=true maps ids to strings; call invert(ids)");
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
  if (options_.output_mode == "int") return out;
  at::Tensor drop = any_dropped ? out < 0 : at::Tensor();
  return encode_categorical(at::clamp_min(out, 0), depth(), options_.output_mode, at::kFloat, "StringLookup", drop);
}

std::vector<std::string> layers::StringLookupImpl::invert(const at::Tensor& ids_in) const {
  at::Tensor ids = ids_in.to(at::kLong).contiguous().reshape(-1);
  std::vector<std::string> out;
  const int64_t* p = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int64_t k = p[i] - token_start();
    if (options_.mask_token && p[i] == 0)
      out.push_back(*options_.mask_token);
    else
      out.push_back(k >= 0 && k < (int64_t)options_.vocabulary.size() ? options_.vocabulary[k] : options_.oov_token);
  }
  return out;
}

std::vector<std::string> layers::StringLookupImpl::get_vocabulary(bool include_special_tokens) const {
  std::vector<std::string> out;
  if (include_special_tokens) {
    if (options_.mask_token && options_.output_mode == "int") out.push_back(*options_.mask_token);
    for (int64_t i = 0; i < options_.num_oov_indices; ++i) out.push_back(options_.oov_token);
  }
  out.insert(out.end(), options_.vocabulary.begin(), options_.vocabulary.end());
  return out;
}

at::Tensor layers::StringLookupImpl::call1(const at::Tensor& x, bool training) {
  const std::string owner = "StringLookup '" + name() + "'";
  if (options_.invert) {
    if (x.scalar_type() == string_storage_dtype || at::isFloatingType(x.scalar_type()))
      throw ValueError(owner + ": invert=true takes integer ids; received a " + dtype_to_string(x.scalar_type()) +
                       " tensor");
    return strings::encode(invert(x.to(at::kCPU)), sizes_of(x)).to(x.device());
  }
  return (*this)(string_input(x, owner), strings::logical_shape(x)).to(x.device());
}

std::vector<Shape> layers::StringLookupImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  if (options_.output_mode == "int") return input_shapes;
  return {encoded_shape(input_shapes.at(0), depth(), options_.output_mode, "StringLookup '" + name() + "'")};
}

std::vector<at::ScalarType> layers::StringLookupImpl::compute_output_dtype(const std::vector<at::ScalarType>& in) {
  if (options_.invert) return {kStringDType};
  return {options_.output_mode == "int" ? at::kLong : at::kFloat};
}

Json layers::StringLookupImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, string_lookup_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(StringLookup, layers::StringLookupImpl);

// --- TextVectorization --------------------------------------------------------------
namespace {
// Keras's ngrams: null, n (the widths 1..n) or a list of widths; each > 0.
std::vector<int64_t> text_ngrams(ConfigReader& r) {
  const Json* n = r.get("ngrams");
  if (!n) return {};
  const char* expected = "null, a positive integer n (1..n-grams) or a list of positive integers";
  std::vector<int64_t> widths;
  if (n->is_number_integer()) {
    if (n->get<int64_t>() < 1 || n->get<int64_t>() > 64) r.invalid("ngrams", expected);
    for (int64_t w = 1; w <= n->get<int64_t>(); ++w) widths.push_back(w);
    return widths;
  }
  if (!n->is_array() || n->empty()) r.invalid("ngrams", expected);
  for (auto& w : *n) {
    if (!w.is_number_integer() || w.get<int64_t>() < 1 || w.get<int64_t>() > 64) r.invalid("ngrams", expected);
    widths.push_back(w.get<int64_t>());
  }
  return widths;
}

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
  text_ngrams(r);
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

layers::TextVectorizationImpl::TextVectorizationImpl(const Json& config)
    : SimpleLayer(config), lookup_(text_lookup_config(config)) {
  config_ = config.is_object() ? config : Json::object();
  config_.erase("vocabulary");
  {
    ConfigReader r(config_, "TextVectorization");
    ngrams_ = text_ngrams(r);
  }
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
  if (!ngrams_.empty() && split_.empty())
    throw ValueError("TextVectorization: ngrams needs a split (n-grams join tokens); received split=null with ngrams=" +
                     config_["ngrams"].dump());
}

std::vector<std::string> layers::TextVectorizationImpl::tokenize(const std::string& text) const {
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
  if (ngrams_.empty()) return out;
  // tf.strings.ngrams(tokens, widths, separator=" "): every n-gram of the
  // first width, then of the next.
  std::vector<std::string> grams;
  for (int64_t w : ngrams_)
    for (size_t i = 0; i + (size_t)w <= out.size(); ++i) {
      std::string g = out[i];
      for (int64_t k = 1; k < w; ++k) g += " " + out[i + k];
      grams.push_back(std::move(g));
    }
  return grams;
}

void layers::TextVectorizationImpl::adapt(const std::vector<std::string>& texts) {
  std::unordered_map<std::string, int64_t> counts;
  for (auto& t : texts)
    for (auto& tok : tokenize(t)) ++counts[tok];
  lookup_.adapt_counts(counts);
}

void layers::TextVectorizationImpl::adapt(const at::Tensor& texts) { adapt(one_batch(texts)); }

void layers::TextVectorizationImpl::adapt(const std::function<at::Tensor()>& next_batch) {
  std::unordered_map<std::string, int64_t> counts;
  for_each_string(next_batch, "TextVectorization '" + name() + "': adapt", [&](const std::string& t) {
    for (auto& tok : tokenize(t)) ++counts[tok];
  });
  lookup_.adapt_counts(counts);
}

at::Tensor layers::TextVectorizationImpl::call1(const at::Tensor& x, bool training) {
  const std::string owner = "TextVectorization '" + name() + "'";
  std::vector<std::string> texts = string_input(x, owner);
  const Shape s = strings::logical_shape(x);
  if (!(s.size() == 1 || (s.size() == 2 && s[1] == 1)))
    throw ShapeError(owner + " takes strings of shape (batch,) or (batch, 1). Received shape " + shape_to_string(s));
  return (*this)(texts).to(x.device());
}

std::vector<Shape> layers::TextVectorizationImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  const Shape& s = input_shapes.at(0);
  if (!(s.size() == 1 || (s.size() == 2 && s[1] == 1)))
    throw ShapeError("TextVectorization '" + name() + "' takes strings of shape (batch,) or (batch, 1). Received " +
                     shape_to_string(s) +
                     " (a model built on a string tensor's bytes? start it with Input(shape, kStringDType))");
  if (output_mode_ != "int") return {{s[0], lookup_.depth()}};
  return {{s[0], sequence_length_ ? *sequence_length_ : kNone}};
}

std::vector<at::ScalarType> layers::TextVectorizationImpl::compute_output_dtype(const std::vector<at::ScalarType>& in) {
  return {output_mode_ == "int" ? at::kLong : at::kFloat};
}

at::Tensor layers::TextVectorizationImpl::operator()(const std::vector<std::string>& texts) const {
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

Json layers::TextVectorizationImpl::get_config() const {
  // The base keys, then the rest as given; the vocabulary (given or adapted)
  // is part of the config, so model.json carries it.
  Json j = base_config();
  for (auto it = config_.begin(); it != config_.end(); ++it) j[it.key()] = it.value();
  j["vocabulary"] = lookup_.options_.vocabulary.empty() ? Json(nullptr) : Json(lookup_.options_.vocabulary);
  return j;
}

KILN_REGISTER_LAYER_AS(TextVectorization, layers::TextVectorizationImpl);

}  // namespace kiln
