// Python str.format for checkpoint file names, as Keras's ModelCheckpoint
// uses it: "ckpt/model-{epoch:02d}-{val_loss:.2f}.safetensors".
//
// Supported: "{name}" and "{name:spec}" with spec
// [[fill]align][sign][0][width][.precision][type], type one of d, f, F, e,
// E, g, G, %, s (or none); "{{" and "}}" for literal braces. Integers take
// d (and the float types); floats take the float types ("{x}" prints
// Python's repr, e.g. 0.1 -> "0.1"). ValueError names the pattern and the
// problem (an unknown key lists the known ones).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>

namespace kiln {

using FormatValue = std::variant<int64_t, double>;

std::string python_format(const std::string& pattern, const std::map<std::string, FormatValue>& values);

// Python's repr of a float ("0.1", "1e-05", "3.0", "inf", "nan").
std::string python_float_repr(double v);

}  // namespace kiln
