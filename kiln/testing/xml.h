// A strict little XML reader for tests that check generated documents (the
// SVG plots of kiln/plot): elements, attributes, text and the five
// predefined entities; a prolog and comments are skipped. Anything else
// (unbalanced tags, a bare '<' or '&' in text, an unknown entity, an
// unquoted attribute) is a parse error, so "parses" means well-formed for
// the subset kiln writes.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kiln {

struct XmlElement {
  std::string name;
  std::map<std::string, std::string> attributes;  // values unescaped
  std::vector<std::unique_ptr<XmlElement>> children;
  std::string text;  // the element's own text, unescaped (children's excluded)

  std::string attr(const std::string& key) const;  // "" if absent
  // Every descendant (depth first, not this one) with that tag name, and
  // optionally that `class` attribute.
  std::vector<const XmlElement*> find_all(const std::string& tag, const std::string& cls = "") const;
};

// The root element; std::runtime_error naming the offset on malformed input.
std::unique_ptr<XmlElement> parse_xml(const std::string& text);

}  // namespace kiln
