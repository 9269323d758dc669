#include "kiln/testing/xml.h"

#include <stdexcept>

namespace kiln {
namespace {

class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}

  std::unique_ptr<XmlElement> document() {
    skip_misc();
    auto root = element();
    skip_misc();
    if (at_ != s_.size()) fail("content after the root element");
    return root;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("XML: " + what + " at offset " + std::to_string(at_));
  }
  bool starts(const char* p) const { return s_.compare(at_, std::char_traits<char>::length(p), p) == 0; }
  void skip_space() {
    while (at_ < s_.size() && std::isspace((unsigned char)s_[at_])) ++at_;
  }
  void skip_past(const char* end) {
    size_t e = s_.find(end, at_);
    if (e == std::string::npos) fail(std::string("missing ") + end);
    at_ = e + std::char_traits<char>::length(end);
  }
  void skip_misc() {  // whitespace, <?...?>, <!-- -->
    for (;;) {
      skip_space();
      if (starts("<?")) {
        skip_past("?>");
      } else if (starts("<!--")) {
        skip_past("-->");
      } else {
        return;
      }
    }
  }
  std::string name() {
    size_t b = at_;
    while (at_ < s_.size() && (std::isalnum((unsigned char)s_[at_]) || s_[at_] == '-' || s_[at_] == '_' ||
                               s_[at_] == ':' || s_[at_] == '.'))
      ++at_;
    if (b == at_) fail("expected a name");
    return s_.substr(b, at_ - b);
  }
  std::string unescape(const std::string& raw) {
    std::string out;
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] == '<') fail("a bare '<'");
      if (raw[i] != '&') {
        out += raw[i];
        continue;
      }
      size_t semi = raw.find(';', i);
      if (semi == std::string::npos) fail("a bare '&'");
      const std::string e = raw.substr(i + 1, semi - i - 1);
      if (e == "amp")
        out += '&';
      else if (e == "lt")
        out += '<';
      else if (e == "gt")
        out += '>';
      else if (e == "quot")
        out += '"';
      else if (e == "apos")
        out += '\'';
      else
        fail("unknown entity &" + e + ";");
      i = semi;
    }
    return out;
  }
  std::unique_ptr<XmlElement> element() {
    if (!starts("<")) fail("expected '<'");
    ++at_;
    auto el = std::make_unique<XmlElement>();
    el->name = name();
    for (;;) {
      skip_space();
      if (starts("/>")) {
        at_ += 2;
        return el;
      }
      if (starts(">")) {
        ++at_;
        break;
      }
      std::string key = name();
      skip_space();
      if (!starts("=")) fail("expected '=' after " + key);
      ++at_;
      skip_space();
      if (!starts("\"") && !starts("'")) fail("an unquoted attribute value");
      const char q = s_[at_++];
      size_t e = s_.find(q, at_);
      if (e == std::string::npos) fail("an unterminated attribute value");
      if (el->attributes.count(key)) fail("a repeated attribute " + key);
      el->attributes[key] = unescape(s_.substr(at_, e - at_));
      at_ = e + 1;
    }
    for (;;) {  // content
      size_t lt = s_.find('<', at_);
      if (lt == std::string::npos) fail("unclosed <" + el->name + ">");
      el->text += unescape(s_.substr(at_, lt - at_));
      at_ = lt;
      if (starts("<!--")) {
        skip_past("-->");
      } else if (starts("</")) {
        at_ += 2;
        if (name() != el->name) fail("mismatched closing tag for <" + el->name + ">");
        skip_space();
        if (!starts(">")) fail("expected '>'");
        ++at_;
        return el;
      } else {
        el->children.push_back(element());
      }
    }
  }

  const std::string& s_;
  size_t at_ = 0;
};

void collect(const XmlElement& e, const std::string& tag, const std::string& cls, std::vector<const XmlElement*>* out) {
  for (const auto& c : e.children) {
    if (c->name == tag && (cls.empty() || c->attr("class") == cls)) out->push_back(c.get());
    collect(*c, tag, cls, out);
  }
}

}  // namespace

std::string XmlElement::attr(const std::string& key) const {
  auto it = attributes.find(key);
  return it == attributes.end() ? "" : it->second;
}

std::vector<const XmlElement*> XmlElement::find_all(const std::string& tag, const std::string& cls) const {
  std::vector<const XmlElement*> out;
  collect(*this, tag, cls, &out);
  return out;
}

std::unique_ptr<XmlElement> parse_xml(const std::string& text) { return Parser(text).document(); }

}  // namespace kiln
