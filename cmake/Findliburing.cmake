# Findliburing: Debian's liburing-dev has a pkg-config file but no CMake config. Defines liburing::liburing.
# pkg-config (liburing.pc) is asked first and gives the version and the hints; without pkg-config the header and the
# library are searched for in the usual places. Sets liburing_FOUND and liburing_VERSION (when pkg-config knows it).
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(PC_LIBURING QUIET liburing)
endif()
find_path(LIBURING_INCLUDE_DIR liburing.h HINTS ${PC_LIBURING_INCLUDEDIR} ${PC_LIBURING_INCLUDE_DIRS})
find_library(LIBURING_LIBRARY uring HINTS ${PC_LIBURING_LIBDIR} ${PC_LIBURING_LIBRARY_DIRS})
if(PC_LIBURING_VERSION)
  set(liburing_VERSION ${PC_LIBURING_VERSION})
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(liburing REQUIRED_VARS LIBURING_LIBRARY LIBURING_INCLUDE_DIR
                                  VERSION_VAR liburing_VERSION)
if(liburing_FOUND AND NOT TARGET liburing::liburing)
  add_library(liburing::liburing UNKNOWN IMPORTED)
  set_target_properties(liburing::liburing PROPERTIES
    IMPORTED_LOCATION "${LIBURING_LIBRARY}" INTERFACE_INCLUDE_DIRECTORIES "${LIBURING_INCLUDE_DIR}")
endif()
mark_as_advanced(LIBURING_INCLUDE_DIR LIBURING_LIBRARY)
