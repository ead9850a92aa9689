#pragma once

namespace lockstep {
inline constexpr const char* kVersion = "0.1.0";
}
