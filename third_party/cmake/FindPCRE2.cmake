# FindPCRE2: PCRE2's 8-bit library, for the tokenizer's pre-tokenisation pattern (src/text/).
#
# Debian's libpcre2-dev ships a pkg-config file and a pcre2-config script but no CMake package
# config; this module finds pcre2.h and libpcre2-8 directly, reads the version from pcre2.h, and
# provides the imported target PCRE2::pcre2-8. Consumers of pcre2.h must define
# PCRE2_CODE_UNIT_WIDTH=8 before including it; the target says so.
#
# Hints: PCRE2_ROOT (CMake's <Package>_ROOT), CMAKE_PREFIX_PATH.
# Result: PCRE2_FOUND, PCRE2_VERSION, PCRE2_INCLUDE_DIR, PCRE2_LIBRARY, target PCRE2::pcre2-8.
include(FindPackageHandleStandardArgs)

find_path(PCRE2_INCLUDE_DIR pcre2.h PATH_SUFFIXES include)
find_library(PCRE2_LIBRARY NAMES pcre2-8 PATH_SUFFIXES lib lib64)

if(PCRE2_INCLUDE_DIR AND EXISTS "${PCRE2_INCLUDE_DIR}/pcre2.h")
  file(STRINGS "${PCRE2_INCLUDE_DIR}/pcre2.h" _pcre2_version_lines
    REGEX "^#define PCRE2_(MAJOR|MINOR)[ \t]+[0-9]+")
  string(REGEX MATCH "PCRE2_MAJOR[ \t]+([0-9]+)" _ "${_pcre2_version_lines}")
  set(_pcre2_major "${CMAKE_MATCH_1}")
  string(REGEX MATCH "PCRE2_MINOR[ \t]+([0-9]+)" _ "${_pcre2_version_lines}")
  set(PCRE2_VERSION "${_pcre2_major}.${CMAKE_MATCH_1}")
  unset(_pcre2_version_lines)
  unset(_pcre2_major)
endif()

find_package_handle_standard_args(PCRE2
  REQUIRED_VARS PCRE2_LIBRARY PCRE2_INCLUDE_DIR
  VERSION_VAR PCRE2_VERSION)

if(PCRE2_FOUND AND NOT TARGET PCRE2::pcre2-8)
  add_library(PCRE2::pcre2-8 UNKNOWN IMPORTED)
  set_target_properties(PCRE2::pcre2-8 PROPERTIES
    IMPORTED_LOCATION "${PCRE2_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${PCRE2_INCLUDE_DIR}"
    INTERFACE_COMPILE_DEFINITIONS PCRE2_CODE_UNIT_WIDTH=8)
endif()
mark_as_advanced(PCRE2_INCLUDE_DIR PCRE2_LIBRARY)
