// Whole-file reads for the dataset loaders.
#pragma once

#include <filesystem>
#include <string>

namespace lockstep::detail {

// The bytes of `file`. Throws InputError "FILE: cannot open: REASON" (or "cannot read").
std::string read_file(const std::filesystem::path& file);

}  // namespace lockstep::detail
