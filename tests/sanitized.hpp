// Whether this build runs under a sanitizer (scripts/ci_sanitizers.sh): tests that limit the
// address space (ulimit -v: ASan and TSan reserve terabytes of it), the thread count (LSan
// starts a thread at exit), or measure memory, skip then.
#pragma once

namespace lockstep::test {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

}  // namespace lockstep::test
