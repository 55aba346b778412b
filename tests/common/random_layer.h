// Random layers for the tests of every folder (models/random_layer.h), checked valid.
#pragma once

#include <gtest/gtest.h>

#include <random>

#include "models/random_layer.h"

namespace lipcert::testing {

inline AttentionLayer RandomLayer(const RandomLayerSpec& spec, std::mt19937_64& rng) {
  AttentionLayer L = RandomAttentionLayer(spec, rng);
  EXPECT_EQ(ValidateLayer(L), "");
  return L;
}

}  // namespace lipcert::testing
