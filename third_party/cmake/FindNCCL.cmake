# FindNCCL: the NVIDIA Collective Communications Library. CMake ships no module for it.
#
# Looks for nccl.h and libnccl under $NCCL_HOME, then next to the CUDA toolkit
# (CUDAToolkit_INCLUDE_DIRS and CUDAToolkit_LIBRARY_DIR: call find_package(CUDAToolkit) first),
# then on the usual paths (NCCL_ROOT and CMAKE_PREFIX_PATH work too). Accepts a bare
# libnccl.so.2, as pip's nvidia-nccl wheels ship it. Provides the imported target NCCL::NCCL and
# NCCL_VERSION.
include(FindPackageHandleStandardArgs)

find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS $ENV{NCCL_HOME} ${CUDAToolkit_INCLUDE_DIRS}
  PATH_SUFFIXES include)
find_library(NCCL_LIBRARY
  NAMES nccl libnccl.so.2 NAMES_PER_DIR
  HINTS $ENV{NCCL_HOME} ${CUDAToolkit_LIBRARY_DIR}
  PATH_SUFFIXES lib lib64)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_version_lines
    REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*#define NCCL_${_part} +([0-9]+).*" "\\1" _nccl_${_part}
      "${_nccl_version_lines}")
  endforeach()
  set(NCCL_VERSION "${_nccl_MAJOR}.${_nccl_MINOR}.${_nccl_PATCH}")
  unset(_nccl_version_lines)
endif()

find_package_handle_standard_args(NCCL
  REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
  VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
