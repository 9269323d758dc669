#include "kiln/core/json.h"

#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/core/json_limits.h"

namespace kiln {

namespace {

// Cuts `s` to at most n bytes without splitting a UTF-8 character.
void cut_utf8(std::string& s, size_t n) {
  if (s.size() <= n) return;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  s.resize(n);
}

// Appends v's compact text to `out` until out holds more than `max` bytes;
// each level appends at least one byte, so the recursion is at most max deep.
void dump_prefix(const Json& v, size_t max, std::string& out) {
  if (out.size() > max) return;
  if (v.is_array() || v.is_object()) {
    const bool array = v.is_array();
    out += array ? '[' : '{';
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (out.size() > max) return;
      if (!first) out += ',';
      first = false;
      if (!array) out += Json(it.key()).dump(-1, ' ', false, Json::error_handler_t::replace) + ':';
      dump_prefix(*it, max, out);
    }
    out += array ? ']' : '}';
  } else if (v.is_string()) {
    std::string s = v.get_ref<const std::string&>();
    cut_utf8(s, max + 1);
    out += Json(s).dump(-1, ' ', false, Json::error_handler_t::replace);
  } else {
    out += v.dump();
  }
}

}  // namespace

int json_depth(std::string_view text, int limit) {
  int depth = 0, max_depth = 0;
  bool in_str = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_str) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_str = false;
      continue;
    }
    if (c == '"') {
      in_str = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) max_depth = depth;
      if (max_depth > limit) return max_depth;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

void check_json_depth(std::string_view text, const std::string& what, int limit) {
  if (json_depth(text, limit) > limit)
    throw FormatError(what + " nests JSON lists and objects more than " + std::to_string(limit) +
                      " levels deep; kiln reads at most " + std::to_string(limit));
}

std::string json_error_text(const std::exception& e) {
  std::string text = e.what();
  if (text.rfind("[json.exception.", 0) == 0) {
    const size_t end = text.find("] ");
    if (end != std::string::npos) text.erase(0, end + 2);
  }
  return text;
}

std::string json_excerpt(const Json& v, size_t max_chars) {
  std::string out;
  dump_prefix(v, max_chars, out);
  if (out.size() > max_chars) {
    cut_utf8(out, max_chars);
    out += "...";
  }
  return out;
}

std::string text_excerpt(std::string_view text, size_t max_chars) {
  std::string s(text.substr(0, max_chars + 1));
  const bool cut = s.size() > max_chars;
  cut_utf8(s, max_chars);
  return "'" + s + (cut ? "...'" : "'");
}

Json parse_json(const std::string& text, const std::string& what) {
  // Before parsing: kiln's JSON code recurses once per level.
  check_json_depth(text, what);
  try {
    return Json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range: "number overflow parsing '1e999'"
    std::string msg = e.what();
    // nlohmann prefixes "[json.exception.parse_error.101] "; keep the useful part.
    auto pos = msg.find("] ");
    if (pos != std::string::npos) msg = msg.substr(pos + 2);
    if (msg.size() > 200) {  // "last read: '<token>'" may quote a whole long token
      cut_utf8(msg, 200);
      msg += "...";
    }
    throw FormatError(what + " is not valid JSON: " + msg);
  }
}

Json read_json_file(const std::string& path) { return parse_json(read_file(path), path); }

int64_t json_integer(const Json& v, int64_t lo, int64_t hi, const std::string& name, const std::string& received) {
  if (!v.is_number()) throw ValueError(name + " must be an integer" + received);
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d != std::trunc(d)) throw ValueError(name + " must be a whole number" + received);
    // [-2^63, 2^63): the doubles that convert to int64_t; the range check follows.
    if (std::isfinite(d) && d >= -0x1p63 && d < 0x1p63) {
      const int64_t i = static_cast<int64_t>(d);
      if (i >= lo && i <= hi) return i;
    }
  } else if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u <= static_cast<uint64_t>(INT64_MAX) && static_cast<int64_t>(u) <= hi && static_cast<int64_t>(u) >= lo)
      return static_cast<int64_t>(u);
  } else {
    const int64_t i = v.get<int64_t>();
    if (i >= lo && i <= hi) return i;
  }
  auto bound = [](int64_t b) {
    return b == INT64_MIN ? std::string("-2^63") : b == INT64_MAX ? std::string("2^63-1") : std::to_string(b);
  };
  throw ValueError(name + " is out of range: it must be an integer from " + bound(lo) + " to " + bound(hi) + received);
}

const Json& require(const Json& j, const char* key, const std::string& owner) {
  if (!j.is_object() || !j.contains(key)) throw ValueError(owner + " config is missing `" + key + "`");
  return j.at(key);
}

}  // namespace kiln
