#pragma once
// CORRAL_CHECK: for states that cannot happen. Never for input from the network, disk,
// a user, CUDA or NCCL: those are Results.

#include <cstdio>
#include <cstdlib>

#define CORRAL_CHECK(cond)                                                              \
  do {                                                                                  \
    if (!(cond)) [[unlikely]] {                                                         \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);     \
      std::abort();                                                                     \
    }                                                                                   \
  } while (false)
