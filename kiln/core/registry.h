// Registry<Product, Args...>: the one name -> factory table behind every
// "look it up by name" vocabulary in kiln (layers, losses, metrics,
// optimizers, servable platforms).
//
// Contract:
//   - add(name, factory) registers or replaces: the last registration of a
//     name wins (a custom class may override a built-in one, and a test may
//     re-register a name). Returns true, so it can initialise a static.
//   - find(name) returns a copy of the factory (empty when absent); create()
//     calls it outside the lock, so a factory may itself use the registry
//     (a wrapper layer creating its inner layer).
//   - create(name, args...) throws NotFoundError
//     "unknown <kind> '<name>'; known <kind>s: a, b, c" when absent.
//   - names() is sorted (std::map order).
// Thread safety: every member may be called concurrently.
// Static initialisation: hold a Registry in a function-local static so it
// exists before any KILN_REGISTER_* static that adds to it:
//   Registry<LayerPtr, const Json&>& layer_registry() {
//     static auto* r = new Registry<LayerPtr, const Json&>("layer");
//     return *r;
//   }
// (never destroyed, so registrations from static destructors stay safe).
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/error.h"

namespace kiln {

template <class Product, class... Args>
class Registry {
 public:
  using Factory = std::function<Product(Args...)>;

  // `kind` names one entry in create()'s error ("layer", "platform").
  explicit Registry(std::string kind) : kind_(std::move(kind)) {}
  // Entries present from the start (the built-in vocabulary).
  Registry(std::string kind, std::map<std::string, Factory> initial)
      : kind_(std::move(kind)), factories_(std::move(initial)) {}

  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  bool add(const std::string& name, Factory factory) {
    std::lock_guard<std::mutex> l(mu_);
    factories_[name] = std::move(factory);
    return true;
  }

  Factory find(const std::string& name) const {
    std::lock_guard<std::mutex> l(mu_);
    auto it = factories_.find(name);
    return it == factories_.end() ? Factory() : it->second;
  }

  bool contains(const std::string& name) const {
    std::lock_guard<std::mutex> l(mu_);
    return factories_.count(name) > 0;
  }

  std::vector<std::string> names() const {
    std::lock_guard<std::mutex> l(mu_);
    std::vector<std::string> out;
    out.reserve(factories_.size());
    for (auto& [name, f] : factories_) out.push_back(name);
    return out;
  }

  // names() as "a, b, c", for errors that list the vocabulary.
  std::string joined_names() const {
    std::string out;
    for (auto& n : names()) out += (out.empty() ? "" : ", ") + n;
    return out;
  }

  // "unknown layer 'Dnse'; known layers: Dense, Dropout"
  std::string not_found_message(const std::string& name) const {
    return "unknown " + kind_ + " '" + name + "'; known " + kind_ + "s: " + joined_names();
  }

  Product create(const std::string& name, Args... args) const {
    Factory f = find(name);
    if (!f) throw NotFoundError(not_found_message(name));
    return f(std::forward<Args>(args)...);
  }

  const std::string& kind() const { return kind_; }

 private:
  const std::string kind_;
  mutable std::mutex mu_;
  std::map<std::string, Factory> factories_;  // guarded by mu_
};

}  // namespace kiln
