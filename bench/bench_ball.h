// The ball the bench tools take on one checkpoint layer: their first four arguments,
// MODEL LAYER CENTRE RELATIVE_RADIUS (MODEL and CENTRE as for `lipcert certify`, the radius
// relative to ||X0||_F).
#pragma once

#include <cstdlib>
#include <string>

#include "certify/input_set.h"
#include "models/attention_layer.h"
#include "models/centre.h"
#include "models/loader.h"

namespace lipcert {

struct BenchBall {
  AttentionLayer layer;
  InputSet set;
};

// argv[1..4] as above; the layer as the preset reads it.
inline BenchBall LoadBenchBall(char** argv, const std::string& preset = "bert") {
  LoadOptions lo;
  lo.preset = preset;
  lo.layer = std::atoi(argv[2]);
  BenchBall b;
  b.layer = LoadModel(argv[1], lo).layers.at(0);
  b.set.kind = SetKind::kBall;
  b.set.center = LoadCentre(argv[3], 0, b.layer.d_model);
  b.set.radius = std::atof(argv[4]) * b.set.center.norm();
  return b;
}

}  // namespace lipcert
