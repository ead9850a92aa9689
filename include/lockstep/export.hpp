// LOCKSTEP_API marks what liblockstep exports. The library is compiled with hidden visibility
// (CMake: CXX_VISIBILITY_PRESET hidden), so in a shared build only the classes and functions
// of include/lockstep/ marked with it are visible to programs that link it. In a static build
// it changes nothing.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define LOCKSTEP_API __attribute__((visibility("default")))
#else
#define LOCKSTEP_API
#endif
