# FindOpenBLAS: OpenBLAS through FindBLAS, plus the directory holding its cblas.h.
#
# Debian installs cblas.h under include/<triplet>/openblas-pthread (or openblas-openmp), which is
# not on the default search path. Provides the imported target OpenBLAS::OpenBLAS.
include(FindPackageHandleStandardArgs)

set(BLA_VENDOR OpenBLAS)
find_package(BLAS QUIET)

find_path(OpenBLAS_INCLUDE_DIR cblas.h
  PATH_SUFFIXES
    x86_64-linux-gnu/openblas-pthread aarch64-linux-gnu/openblas-pthread
    openblas-pthread openblas)

find_package_handle_standard_args(OpenBLAS
  REQUIRED_VARS BLAS_LIBRARIES OpenBLAS_INCLUDE_DIR)

if(OpenBLAS_FOUND AND NOT TARGET OpenBLAS::OpenBLAS)
  add_library(OpenBLAS::OpenBLAS INTERFACE IMPORTED)
  set_target_properties(OpenBLAS::OpenBLAS PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${OpenBLAS_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${BLAS_LIBRARIES}")
endif()
mark_as_advanced(OpenBLAS_INCLUDE_DIR)
