#include "kiln/core/names.h"

#include <cctype>
#include <map>
#include <mutex>
#include <set>

namespace kiln {
namespace {
std::mutex g_names_mu;
std::map<std::string, int>& counters() {  // guarded by g_names_mu
  static std::map<std::string, int> m;
  return m;
}
}  // namespace

std::string to_snake_case(const std::string& s) {
  // Keras: insert '_' before an uppercase letter that follows a lowercase
  // letter/digit or precedes a lowercase letter (after an uppercase run).
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (std::isupper((unsigned char)c)) {
      bool prev_lower = i > 0 && (std::islower((unsigned char)s[i - 1]));
      bool next_lower_after_upper =
          i > 0 && std::isupper((unsigned char)s[i - 1]) && i + 1 < s.size() && std::islower((unsigned char)s[i + 1]);
      if (prev_lower || next_lower_after_upper) out += '_';
      out += (char)std::tolower((unsigned char)c);
    } else {
      out += c;
    }
  }
  return out;
}

std::string unique_name(const std::string& base) {
  std::lock_guard<std::mutex> l(g_names_mu);
  int& n = counters()[base];
  std::string name = n == 0 ? base : base + "_" + std::to_string(n);
  ++n;
  return name;
}

void reserve_name(const std::string& name) {
  std::lock_guard<std::mutex> l(g_names_mu);
  auto pos = name.rfind('_');
  if (pos != std::string::npos && pos + 1 < name.size() &&
      std::all_of(name.begin() + pos + 1, name.end(), [](char c) { return std::isdigit((unsigned char)c); })) {
    int k = std::stoi(name.substr(pos + 1));
    int& n = counters()[name.substr(0, pos)];
    n = std::max(n, k + 1);
  } else {
    int& n = counters()[name];
    n = std::max(n, 1);
  }
}

void clear_session() {
  std::lock_guard<std::mutex> l(g_names_mu);
  counters().clear();
}

}  // namespace kiln
