// Sharded weights: a model's weights saved as each process holds them, one
// file per process plus an index, without gathering them anywhere (the
// other form is the ordinary model directory Model::save writes, whole
// variables gathered through process 0). For models too large for one
// process; loads into any mesh (or one process) by reading the parts of
// the shards each process needs.
//
//   dir/weights-<process>.safetensors        this process's pieces; the
//                                            metadata "ranges" maps each
//                                            tensor to its [begin, end) per
//                                            dimension of the whole variable
//   dir/index.json                           {"format": "kiln.sharded_weights",
//                                            "format_version": 1, "variables":
//                                            {path: {"shape", "dtype", "layout"}},
//                                            "files": [...]}, written last
//
// Each piece is written once: a sharded variable by the processes of the
// first data replica (replica_id() 0), a replicated one by process 0.
// index.json is written after every file is complete, so a directory
// without it is an interrupted save (load refuses it).
#pragma once

#include <string>

#include "kiln/models/model.h"

namespace kiln {

// A collective under a distribution: every process calls it. `dir` must not
// hold another save (ValueError).
void save_sharded_weights(const models::Model& model, const std::string& dir);
// Each process assembles its part of every variable from the pieces that
// overlap it. FormatError for a missing index, a variable the files lack or
// cover only in part, or a shape that differs.
void load_sharded_weights(models::Model& model, const std::string& dir);

}  // namespace kiln
