// Auto-unique object names, as Keras gives them: the first Dense is "dense",
// the next "dense_1", ... Counters are per base name and process-wide;
// clear_session() resets them (Keras's keras.backend.clear_session()).
#pragma once

#include <string>

namespace kiln {

// "MultiHeadAttention" -> "multi_head_attention"; "Conv2D" -> "conv2d".
std::string to_snake_case(const std::string& class_name);

// Next unique name for `base` ("dense", "dense_1", ...). Thread-safe.
std::string unique_name(const std::string& base);

// Reserve a user-given name so auto names never collide with it.
void reserve_name(const std::string& name);

void clear_session();

}  // namespace kiln
