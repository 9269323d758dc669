#include "kiln/training/path_format.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "kiln/core/error.h"

namespace kiln {
namespace {

struct Spec {
  char fill = ' ';
  char align = 0;  // '<', '>', '^', '=' or 0 (default)
  char sign = '-';
  int width = 0;
  int precision = -1;
  char type = 0;
};

[[noreturn]] void bad(const std::string& pattern, const std::string& why) {
  throw ValueError("cannot format the file path \"" + pattern + "\": " + why);
}

Spec parse_spec(const std::string& s, const std::string& pattern) {
  Spec sp;
  size_t i = 0;
  auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (s.size() >= 2 && is_align(s[1])) {
    sp.fill = s[0];
    sp.align = s[1];
    i = 2;
  } else if (!s.empty() && is_align(s[0])) {
    sp.align = s[0];
    i = 1;
  }
  if (i < s.size() && (s[i] == '+' || s[i] == '-' || s[i] == ' ')) sp.sign = s[i++];
  if (i < s.size() && s[i] == '0') {
    if (!sp.align) {
      sp.fill = '0';
      sp.align = '=';
    }
    ++i;
  }
  while (i < s.size() && std::isdigit((unsigned char)s[i])) sp.width = sp.width * 10 + (s[i++] - '0');
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (i >= s.size() || !std::isdigit((unsigned char)s[i]))
      bad(pattern, "format spec '" + s + "' has '.' without a precision");
    sp.precision = 0;
    while (i < s.size() && std::isdigit((unsigned char)s[i])) sp.precision = sp.precision * 10 + (s[i++] - '0');
  }
  if (i < s.size()) sp.type = s[i++];
  if (i != s.size()) bad(pattern, "invalid format spec '" + s + "'");
  return sp;
}

std::string pad(std::string body, bool negative, const Spec& sp, bool numeric) {
  std::string sign;
  if (numeric) {
    if (negative)
      sign = "-";
    else if (sp.sign == '+')
      sign = "+";
    else if (sp.sign == ' ')
      sign = " ";
  }
  char align = sp.align ? sp.align : (numeric ? '>' : '<');
  int len = (int)(sign.size() + body.size());
  if (sp.width <= len) return sign + body;
  int n = sp.width - len;
  std::string f(n, sp.fill);
  switch (align) {
    case '<':
      return sign + body + f;
    case '^':
      return std::string(n / 2, sp.fill) + sign + body + std::string(n - n / 2, sp.fill);
    case '=':
      return sign + f + body;
    default:
      return f + sign + body;
  }
}

std::string fmt_float(double v, char type, int precision) {
  if (std::isnan(v)) return (type == 'F' || type == 'E' || type == 'G') ? "NAN" : "nan";
  if (std::isinf(v)) return (type == 'F' || type == 'E' || type == 'G') ? "INF" : "inf";
  char buf[512];
  int p = precision < 0 ? 6 : precision;
  switch (type) {
    case 'f':
    case 'F':
      std::snprintf(buf, sizeof buf, "%.*f", p, v);
      break;
    case 'e':
      std::snprintf(buf, sizeof buf, "%.*e", p, v);
      break;
    case 'E':
      std::snprintf(buf, sizeof buf, "%.*E", p, v);
      break;
    case 'g':
      std::snprintf(buf, sizeof buf, "%.*g", p == 0 ? 1 : p, v);
      break;
    case 'G':
      std::snprintf(buf, sizeof buf, "%.*G", p == 0 ? 1 : p, v);
      break;
    case '%':
      std::snprintf(buf, sizeof buf, "%.*f%%", p, v * 100.0);
      break;
    default:
      return "";
  }
  return buf;
}

}  // namespace

std::string python_float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // "-1.2345e-05"
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t e = sci.find('e');
  int exp = std::stoi(sci.substr(e + 1));
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  std::string out;
  if (exp >= -5 + 1 && exp < 16) {  // Python: repr uses fixed for 1e-4 <= |v| < 1e16
    if (exp >= 0) {
      if ((int)digits.size() <= exp + 1)
        out = digits + std::string(exp + 1 - digits.size(), '0') + ".0";
      else
        out = digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    } else {
      out = "0." + std::string(-exp - 1, '0') + digits;
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  }
  return neg ? "-" + out : out;
}

std::string python_format(const std::string& pattern, const std::map<std::string, FormatValue>& values) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '}') {
      if (i + 1 < pattern.size() && pattern[i + 1] == '}') {
        out += '}';
        ++i;
        continue;
      }
      bad(pattern, "single '}' (write '}}' for a literal brace)");
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < pattern.size() && pattern[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    size_t close = pattern.find('}', i);
    if (close == std::string::npos) bad(pattern, "'{' without a matching '}'");
    std::string field = pattern.substr(i + 1, close - i - 1);
    i = close;
    std::string key = field, spec_text;
    if (auto colon = field.find(':'); colon != std::string::npos) {
      key = field.substr(0, colon);
      spec_text = field.substr(colon + 1);
    }
    auto it = values.find(key);
    if (it == values.end()) {
      std::string known;
      for (auto& [k, v] : values) known += (known.empty() ? "" : ", ") + k;
      bad(pattern, "no value named '" + key + "'; available: " + known);
    }
    Spec sp = parse_spec(spec_text, pattern);
    std::string body;
    bool negative = false;
    if (std::holds_alternative<int64_t>(it->second)) {
      int64_t v = std::get<int64_t>(it->second);
      if (sp.type == 0 || sp.type == 'd') {
        if (sp.precision >= 0) bad(pattern, "precision not allowed in integer format specifier '" + spec_text + "'");
        negative = v < 0;
        body = std::to_string(negative ? -(uint64_t)v : (uint64_t)v);
      } else if (std::string("fFeEgG%").find(sp.type) != std::string::npos) {
        double d = (double)v;
        negative = d < 0;
        body = fmt_float(std::fabs(d), sp.type, sp.precision);
      } else if (sp.type == 's') {
        bad(pattern, "unknown format code 's' for the integer '" + key + "'");
      } else {
        bad(pattern, std::string("unknown format code '") + sp.type + "' for the integer '" + key + "'");
      }
    } else {
      double d = std::get<double>(it->second);
      negative = std::signbit(d) && !std::isnan(d);
      if (sp.type == 0) {
        body = sp.precision >= 0 ? fmt_float(std::fabs(d), 'g', sp.precision) : python_float_repr(std::fabs(d));
      } else if (std::string("fFeEgG%").find(sp.type) != std::string::npos) {
        body = fmt_float(std::fabs(d), sp.type, sp.precision);
      } else {
        bad(pattern, std::string("unknown format code '") + sp.type + "' for the float '" + key + "'");
      }
    }
    out += pad(body, negative, sp, true);
  }
  return out;
}

}  // namespace kiln
