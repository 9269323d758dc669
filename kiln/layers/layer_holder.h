// LayerHolder<Impl>: the value type behind `layers::Dense`, `models::Sequential`
// (PyTorch's torch::nn::Linear / LinearImpl holder pattern).
//
//   auto d = layers::Dense(64, "relu");                 // any XImpl constructor
//   auto e = layers::Dense({.units = 64, .activation = "relu"});  // its Options
//   auto h = layers::Dense(10)(layers::Input({784}));   // Functional call
//   LayerPtr p = d;                                     // shares the layer
//   d->units();  (*d)(x);  d.get();  d.ptr();
//
// A holder owns a std::shared_ptr<Impl>; copies share one layer, as Python
// references to a Keras layer do. It converts implicitly to
// std::shared_ptr<U> for any base U of Impl (LayerPtr, ModelPtr), so it goes
// wherever a LayerPtr is taken. `Holder(nullptr)` is empty. The layer class
// itself is `XImpl`; users subclass Layer / Model, never a holder.
// KILN_LAYER_HOLDER(Name, Options) declares `Name` for `NameImpl` next to it;
// Options is the struct that `NameImpl` takes (or `void` when it takes none).
#pragma once

#include <cstddef>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

// layer.h includes this header before it defines Layer (InputLayer's holder
// is declared there), so the names it needs are declared here.
namespace kiln {
class Layer;
class SimpleLayer;
using LayerPtr = std::shared_ptr<Layer>;
struct KerasTensor;
using KerasTensors = std::vector<KerasTensor>;
using Tensors = std::vector<at::Tensor>;
}  // namespace kiln

namespace kiln::layers {

// The base classes, also under their Keras module's name: layers::Layer.
using ::kiln::Layer;
using ::kiln::LayerPtr;
using ::kiln::SimpleLayer;

namespace detail {
struct NoOptions {};  // the Options of a holder whose Impl takes none
}  // namespace detail

template <class ImplType, class Options = void>
class LayerHolder {
  // Whether (First, Rest...) goes to one of Impl's constructors rather than
  // to the holder's own (nullptr, another holder, the shared_ptr). Declared
  // first: the constructors' default template arguments use it.
  template <class First, class... Rest>
  static constexpr bool forwards() {
    using F = std::remove_cv_t<std::remove_reference_t<First>>;
    return !std::is_same_v<F, std::nullptr_t> && !std::is_base_of_v<LayerHolder, F> &&
           !std::is_same_v<F, std::shared_ptr<ImplType>> && std::is_constructible_v<ImplType, First, Rest...>;
  }

 public:
  using Impl = ImplType;
  using OptionsArg = std::conditional_t<std::is_void_v<Options>, detail::NoOptions, Options>;

  // Default: a new layer from Impl's default constructor, when it has one.
  // (C++17 SFINAE rather than requires-clauses: the clang build is C++17.)
  template <class I = Impl, std::enable_if_t<std::is_default_constructible_v<I>, int> = 0>
  LayerHolder() : impl_(std::make_shared<Impl>()) {}
  LayerHolder(std::nullptr_t) {}  // empty
  LayerHolder(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  // `layers::Dense({.units = 64})`: the braced Options.
  template <class O = Options, std::enable_if_t<!std::is_void_v<O>, int> = 0>
  LayerHolder(const OptionsArg& options) : impl_(std::make_shared<Impl>(options)) {}
  // Every other constructor of Impl: explicit for one argument, as Impl's are.
  template <class First, std::enable_if_t<forwards<First>(), int> = 0>
  explicit LayerHolder(First&& first) : impl_(std::make_shared<Impl>(std::forward<First>(first))) {}
  template <class First, class Second, class... Rest, std::enable_if_t<forwards<First, Second, Rest...>(), int> = 0>
  LayerHolder(First&& first, Second&& second, Rest&&... rest)
      : impl_(std::make_shared<Impl>(std::forward<First>(first), std::forward<Second>(second),
                                     std::forward<Rest>(rest)...)) {}

  Impl* operator->() const { return impl_.get(); }
  Impl& operator*() const { return *impl_; }
  Impl* get() const { return impl_.get(); }
  const std::shared_ptr<Impl>& ptr() const { return impl_; }
  explicit operator bool() const { return impl_ != nullptr; }

  // To LayerPtr, ModelPtr, std::shared_ptr<Impl>: the same layer.
  template <class U, std::enable_if_t<std::is_convertible_v<Impl*, U*>, int> = 0>
  operator std::shared_ptr<U>() const {
    return impl_;
  }

  // The layer's call: tensors, or KerasTensors while building a Functional model.
  // (A trailing decltype, not decltype(auto), so that asking whether a
  // holder is callable, as std::function's constructor does, is a soft "no"
  // for classes without a call, the callbacks.)
  template <class... Args>
  auto operator()(Args&&... args) const -> decltype(std::declval<Impl&>()(std::forward<Args>(args)...)) {
    return (*impl_)(std::forward<Args>(args)...);
  }
  KerasTensors operator()(const KerasTensors& inputs) const { return (*impl_)(inputs); }
  Tensors operator()(const Tensors& inputs, bool training = false) const { return (*impl_)(inputs, training); }

  template <class U>
  friend bool operator==(const LayerHolder& a, const std::shared_ptr<U>& b) {
    return a.impl_ == b;
  }
  template <class U>
  friend bool operator==(const std::shared_ptr<U>& b, const LayerHolder& a) {
    return a.impl_ == b;
  }
  template <class U>
  friend bool operator!=(const LayerHolder& a, const std::shared_ptr<U>& b) {
    return a.impl_ != b;
  }
  template <class U>
  friend bool operator!=(const std::shared_ptr<U>& b, const LayerHolder& a) {
    return a.impl_ != b;
  }
  // (Both orders and != spelled out: the clang build is C++17, which does not
  // rewrite them from ==.)
  friend bool operator==(const LayerHolder& a, const LayerHolder& b) { return a.impl_ == b.impl_; }
  friend bool operator!=(const LayerHolder& a, const LayerHolder& b) { return a.impl_ != b.impl_; }
  friend bool operator==(const LayerHolder& a, std::nullptr_t) { return a.impl_ == nullptr; }
  friend bool operator!=(const LayerHolder& a, std::nullptr_t) { return a.impl_ != nullptr; }

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace kiln::layers

// Declares the holder `Name` of `NameImpl` (in the current namespace).
#define KILN_LAYER_HOLDER(Name, Options)                                 \
  class Name : public ::kiln::layers::LayerHolder<Name##Impl, Options> { \
   public:                                                               \
    using ::kiln::layers::LayerHolder<Name##Impl, Options>::LayerHolder; \
  }
