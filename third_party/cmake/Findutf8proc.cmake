# Findutf8proc: utf8proc, for the tokenizer's NFC normaliser (src/text/normalize.cpp).
#
# Debian's libutf8proc-dev ships a pkg-config file but no CMake package config; this module finds
# utf8proc.h and libutf8proc directly, reads the version from utf8proc.h, and provides the
# imported target utf8proc::utf8proc.
#
# Hints: utf8proc_ROOT (CMake's <Package>_ROOT), CMAKE_PREFIX_PATH.
# Result: utf8proc_FOUND, utf8proc_VERSION, utf8proc_INCLUDE_DIR, utf8proc_LIBRARY, target
# utf8proc::utf8proc.
include(FindPackageHandleStandardArgs)

find_path(utf8proc_INCLUDE_DIR utf8proc.h PATH_SUFFIXES include)
find_library(utf8proc_LIBRARY NAMES utf8proc PATH_SUFFIXES lib lib64)

if(utf8proc_INCLUDE_DIR AND EXISTS "${utf8proc_INCLUDE_DIR}/utf8proc.h")
  file(STRINGS "${utf8proc_INCLUDE_DIR}/utf8proc.h" _utf8proc_version_lines
    REGEX "^#define UTF8PROC_VERSION_(MAJOR|MINOR|PATCH)[ \t]+[0-9]+")
  set(utf8proc_VERSION "")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX MATCH "UTF8PROC_VERSION_${_part}[ \t]+([0-9]+)" _ "${_utf8proc_version_lines}")
    string(APPEND utf8proc_VERSION "${CMAKE_MATCH_1}.")
  endforeach()
  string(REGEX REPLACE "\\.$" "" utf8proc_VERSION "${utf8proc_VERSION}")
  unset(_utf8proc_version_lines)
endif()

find_package_handle_standard_args(utf8proc
  REQUIRED_VARS utf8proc_LIBRARY utf8proc_INCLUDE_DIR
  VERSION_VAR utf8proc_VERSION)

if(utf8proc_FOUND AND NOT TARGET utf8proc::utf8proc)
  add_library(utf8proc::utf8proc UNKNOWN IMPORTED)
  set_target_properties(utf8proc::utf8proc PROPERTIES
    IMPORTED_LOCATION "${utf8proc_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${utf8proc_INCLUDE_DIR}")
endif()
mark_as_advanced(utf8proc_INCLUDE_DIR utf8proc_LIBRARY)
