// ck.h — CK(call): a CUDA runtime call checked; on failure the error, the
// place and the call on stderr, then exit(CK_EXIT). The layer's own tests
// share it (test_cases.h for test_layer.cu and test_wmma.cu, and
// test_graph_nccl.cu); each defines CK_EXIT, its exit status for "a call
// failed", before including it.
#pragma once

#include <cstdio>   // fprintf
#include <cstdlib>  // exit

#ifndef CK_EXIT
#error "define CK_EXIT (CK's exit status) before including ck.h"
#endif
#define CK(call)                                                                                        \
    do {                                                                                                \
        cudaError_t e_ = (call);                                                                        \
        if (e_ != cudaSuccess) {                                                                        \
            fprintf(stderr, "CUDA error %d (%s) at %s:%d: %s\n", (int)e_, cudaGetErrorString(e_), __FILE__, \
                    __LINE__, #call);                                                                   \
            exit(CK_EXIT);                                                                              \
        }                                                                                               \
    } while (0)
