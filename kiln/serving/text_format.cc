#include "kiln/serving/text_format.h"

#include <cctype>

#include "kiln/core/error.h"

namespace kiln::serving {
namespace {

class Reader {
 public:
  Reader(const std::string& t, const std::string& what, bool multiline) : t_(t), what_(what), multiline_(multiline) {}

  std::vector<TextField> message(char close) {
    std::vector<TextField> out;
    for (;;) {
      skip();
      if (pos_ >= t_.size()) {
        if (close) fail(std::string("missing '") + close + "'");
        return out;
      }
      if (close && t_[pos_] == close) {
        ++pos_;
        return out;
      }
      TextField f;
      f.line = line_;
      f.name = ident();
      if (f.name.empty()) fail(std::string("expected a field name, found '") + t_[pos_] + "'");
      skip();
      bool colon = false;
      if (pos_ < t_.size() && t_[pos_] == ':') {
        ++pos_;
        colon = true;
        skip();
      }
      if (pos_ < t_.size() && (t_[pos_] == '{' || t_[pos_] == '<')) {
        char c = t_[pos_++] == '{' ? '}' : '>';
        f.is_message = true;
        f.fields = message(c);
      } else {
        if (!colon) fail("expected ':' or '{' after `" + f.name + "`");
        scalar(f);
      }
      skip();
      if (pos_ < t_.size() && (t_[pos_] == ';' || t_[pos_] == ',')) ++pos_;
      out.push_back(std::move(f));
    }
  }

 private:
  [[noreturn]] void fail(const std::string& m) {
    throw ValueError(what_ + ": line " + std::to_string(line_) + ": " + m);
  }
  void skip() {
    while (pos_ < t_.size()) {
      char c = t_[pos_];
      if (c == '\n')
        ++line_, ++pos_;
      else if (std::isspace((unsigned char)c))
        ++pos_;
      else if (c == '#') {
        while (pos_ < t_.size() && t_[pos_] != '\n') ++pos_;
      } else
        break;
    }
  }
  std::string ident() {
    size_t s = pos_;
    while (pos_ < t_.size() && (std::isalnum((unsigned char)t_[pos_]) || t_[pos_] == '_' || t_[pos_] == '.' ||
                                t_[pos_] == '-' || t_[pos_] == '+'))
      ++pos_;
    return t_.substr(s, pos_ - s);
  }
  void scalar(TextField& f) {
    if (pos_ >= t_.size()) fail("missing value for `" + f.name + "`");
    char q = t_[pos_];
    if (q == '"' || q == '\'') {
      f.quoted = true;
      ++pos_;
      // Adjacent literals concatenate, as in protobuf.
      for (;;) {
        while (pos_ < t_.size() && t_[pos_] != q) {
          char c = t_[pos_++];
          if (c == '\n' && !multiline_) fail("unterminated string for `" + f.name + "`");
          if (c == '\n') ++line_;
          if (c == '\\' && pos_ < t_.size()) {
            char e = t_[pos_++];
            switch (e) {
              case 'n':
                c = '\n';
                break;
              case 't':
                c = '\t';
                break;
              case 'r':
                c = '\r';
                break;
              default:
                c = e;
            }
          }
          f.scalar += c;
        }
        if (pos_ >= t_.size()) fail("unterminated string for `" + f.name + "`");
        ++pos_;
        size_t save = pos_;
        int save_line = line_;
        skip();
        if (pos_ < t_.size() && t_[pos_] == q) {
          ++pos_;
          continue;
        }
        pos_ = save;
        line_ = save_line;
        break;
      }
      return;
    }
    f.scalar = ident();
    if (f.scalar.empty()) fail("expected a value for `" + f.name + "`, found '" + std::string(1, q) + "'");
  }

  const std::string& t_;
  std::string what_;
  bool multiline_ = false;
  size_t pos_ = 0;
  int line_ = 1;
};

}  // namespace

std::string TextField::as_string(const std::string& what) const {
  if (is_message || !quoted)
    throw ValueError(what + ": line " + std::to_string(line) + ": `" + name + "` must be a quoted string");
  return scalar;
}

int64_t TextField::as_int(const std::string& what) const {
  if (is_message || quoted || scalar.empty())
    throw ValueError(what + ": line " + std::to_string(line) + ": `" + name + "` must be an integer");
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(scalar, &used);
  } catch (...) {
    used = 0;
  }
  if (used != scalar.size())
    throw ValueError(what + ": line " + std::to_string(line) + ": `" + name +
                     "` must be an integer. Received: " + scalar);
  return v;
}

bool TextField::as_bool(const std::string& what) const {
  if (!is_message && !quoted && (scalar == "true" || scalar == "1")) return true;
  if (!is_message && !quoted && (scalar == "false" || scalar == "0")) return false;
  throw ValueError(what + ": line " + std::to_string(line) + ": `" + name + "` must be true or false");
}

std::vector<TextField> parse_text_format(const std::string& text, const std::string& what,
                                         bool allow_multiline_strings) {
  Reader r(text, what, allow_multiline_strings);
  return r.message(0);
}

}  // namespace kiln::serving
