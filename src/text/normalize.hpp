// Unicode normalisation for tokenizer.json's normalizers, with utf8proc (Debian's
// libutf8proc-dev), whose tables are the Unicode release it was built with (2.8: Unicode 15.0).
#pragma once

#include <string>
#include <string_view>

namespace lockstep::detail {

// `text` (valid UTF-8) in Normalization Form C, into `out` (replaced). ASCII text is its own NFC
// and is copied without asking utf8proc.
void nfc(std::string_view text, std::string& out);

}  // namespace lockstep::detail
