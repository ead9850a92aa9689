# FindDNNL: oneDNN's CPU engine, without the OpenCL headers that its own package config wants.
#
# Debian builds oneDNN 2.6 with its OpenCL GPU runtime, so dnnl-config.cmake runs
# find_package(OpenCL REQUIRED) and links OpenCL::OpenCL, which needs ocl-icd-opencl-dev (only a
# Recommends of libdnnl-dev). lockstep uses the CPU engine only: it needs dnnl.hpp and libdnnl.so,
# nothing of OpenCL at build time (libdnnl.so.2 brings libOpenCL.so.1 itself, through libdnnl2's
# Depends). This module finds those two files, reads the version from dnnl_version.h, and
# provides the imported target DNNL::dnnl, the name oneDNN's own config gives it.
#
# Hints: DNNL_ROOT or DNNLROOT (CMake's <Package>_ROOT), CMAKE_PREFIX_PATH.
# Result: DNNL_FOUND, DNNL_VERSION, DNNL_INCLUDE_DIR, DNNL_LIBRARY, target DNNL::dnnl.
include(FindPackageHandleStandardArgs)

find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp HINTS ENV DNNLROOT PATH_SUFFIXES include)
find_library(DNNL_LIBRARY NAMES dnnl HINTS ENV DNNLROOT PATH_SUFFIXES lib lib64)

if(DNNL_INCLUDE_DIR AND EXISTS "${DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h")
  file(STRINGS "${DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h" _dnnl_version_lines
    REGEX "^#define DNNL_VERSION_(MAJOR|MINOR|PATCH) +[0-9]+")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX MATCH "DNNL_VERSION_${_part} +([0-9]+)" _ "${_dnnl_version_lines}")
    set(DNNL_VERSION_${_part} "${CMAKE_MATCH_1}")
  endforeach()
  set(DNNL_VERSION "${DNNL_VERSION_MAJOR}.${DNNL_VERSION_MINOR}.${DNNL_VERSION_PATCH}")
  unset(_dnnl_version_lines)
  unset(_part)
endif()

find_package_handle_standard_args(DNNL
  REQUIRED_VARS DNNL_LIBRARY DNNL_INCLUDE_DIR
  VERSION_VAR DNNL_VERSION)

if(DNNL_FOUND AND NOT TARGET DNNL::dnnl)
  add_library(DNNL::dnnl UNKNOWN IMPORTED)
  set_target_properties(DNNL::dnnl PROPERTIES
    IMPORTED_LOCATION "${DNNL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${DNNL_INCLUDE_DIR}")
endif()
mark_as_advanced(DNNL_INCLUDE_DIR DNNL_LIBRARY)
