# FindCUDNN: NVIDIA's cuDNN, the library the cuDNN frontend's graphs run on (the CUDA backend's
# fused attention, src/cuda/cudnn_attention.cpp). CMake ships no module for it.
#
# cudnn.h and libcudnn next to the CUDA toolkit (CUDAToolkit_INCLUDE_DIRS and
# CUDAToolkit_LIBRARY_DIR: call find_package(CUDAToolkit) first), or under CUDNN_ROOT (variable or
# environment), e.g. PyTorch's nvidia-cudnn package (site-packages/nvidia/cudnn/{include,lib},
# whose library is a bare libcudnn.so.9).
#
# Hints: CUDNN_ROOT (variable or environment), CMAKE_PREFIX_PATH.
# Result: CUDNN_FOUND, CUDNN_INCLUDE_DIR, CUDNN_LIBRARY, CUDNN_VERSION; target CUDNN::cudnn
# (cuDNN's header and library, and the toolkit's NVRTC, which the frontend's engines compiled
# into our code call). It is what linking lockstep needs of cuDNN: an installed lockstep finds
# this module, never the frontend's headers (FindCudnnFrontend.cmake), which only its build reads.
include(FindPackageHandleStandardArgs)

find_path(CUDNN_INCLUDE_DIR cudnn.h
  HINTS ${CUDNN_ROOT} $ENV{CUDNN_ROOT} ${CUDAToolkit_INCLUDE_DIRS}
  PATH_SUFFIXES include)
find_library(CUDNN_LIBRARY
  NAMES cudnn libcudnn.so.9 NAMES_PER_DIR
  HINTS ${CUDNN_ROOT} $ENV{CUDNN_ROOT} ${CUDAToolkit_LIBRARY_DIR}
  PATH_SUFFIXES lib lib64)

if(CUDNN_INCLUDE_DIR AND EXISTS "${CUDNN_INCLUDE_DIR}/cudnn_version.h")
  file(STRINGS "${CUDNN_INCLUDE_DIR}/cudnn_version.h" _cudnn_lines
    REGEX "^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) +[0-9]+")
  foreach(_part MAJOR MINOR PATCHLEVEL)
    string(REGEX MATCH "CUDNN_${_part} +([0-9]+)" _ "${_cudnn_lines}")
    set(_cudnn_${_part} "${CMAKE_MATCH_1}")
  endforeach()
  set(CUDNN_VERSION "${_cudnn_MAJOR}.${_cudnn_MINOR}.${_cudnn_PATCHLEVEL}")
  unset(_cudnn_lines)
endif()

find_package_handle_standard_args(CUDNN
  REQUIRED_VARS CUDNN_INCLUDE_DIR CUDNN_LIBRARY
  VERSION_VAR CUDNN_VERSION)

if(CUDNN_FOUND AND NOT TARGET CUDNN::cudnn)
  add_library(CUDNN::cudnn INTERFACE IMPORTED)
  set_target_properties(CUDNN::cudnn PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${CUDNN_LIBRARY}")
  if(TARGET CUDA::nvrtc)
    set_property(TARGET CUDNN::cudnn APPEND PROPERTY INTERFACE_LINK_LIBRARIES CUDA::nvrtc)
  endif()
endif()
mark_as_advanced(CUDNN_INCLUDE_DIR CUDNN_LIBRARY)
