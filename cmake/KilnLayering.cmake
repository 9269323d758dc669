# Checks that each kiln folder includes only the folders its library links
# (directly or through them): the rules are the kiln_* libraries of each
# kiln_component() call in CMakeLists.txt, which passes them here, so the
# check and the link line cannot drift apart. Tests and test helpers
# (*_test.cc, *_test_util.h) are not checked: test binaries link everything.
# One line per wrong include names the file, the include and what the folder
# may include.
# Usage (ctest runs it as kiln_layering):
#   cmake -DKILN_SOURCE_DIR=<repo> -DKILN_LAYERING="<folder>:<allowed>,<allowed>|..." -P cmake/KilnLayering.cmake
cmake_minimum_required(VERSION 3.18)
string(REPLACE "|" ";" rules "${KILN_LAYERING}")
set(failures 0)
set(checked 0)
foreach(rule ${rules})
  string(REGEX MATCH "^([a-z0-9_]+):(.*)$" ok "${rule}")
  if(NOT ok)
    message(FATAL_ERROR "KilnLayering: malformed rule '${rule}'")
  endif()
  set(folder ${CMAKE_MATCH_1})
  string(REPLACE "," ";" allowed "${CMAKE_MATCH_2}")
  if(allowed)
    string(REPLACE ";" ", " allowed_text "${allowed}")
  else()
    set(allowed_text "itself")
  endif()
  file(GLOB_RECURSE files ${KILN_SOURCE_DIR}/kiln/${folder}/*.h ${KILN_SOURCE_DIR}/kiln/${folder}/*.cc
       ${KILN_SOURCE_DIR}/kiln/${folder}/*.cu)
  list(FILTER files EXCLUDE REGEX "(_test\\.cc|_test_util\\.h|/testdata/.*)$")
  foreach(f ${files})
    math(EXPR checked "${checked} + 1")
    file(STRINGS ${f} includes REGEX "^[ \t]*#[ \t]*include[ \t]*\"kiln/[a-z0-9_]+/")
    foreach(line ${includes})
      string(REGEX MATCH "kiln/([a-z0-9_]+)/[^\"]*" inc "${line}")
      set(to ${CMAKE_MATCH_1})
      if(NOT to STREQUAL folder AND NOT to IN_LIST allowed)
        file(RELATIVE_PATH rel ${KILN_SOURCE_DIR} ${f})
        message("${rel}: #include \"${inc}\" is not allowed: kiln/${folder} may include only ${allowed_text} "
                "(the kiln_* libraries of its kiln_component() in CMakeLists.txt, and those below them)")
        math(EXPR failures "${failures} + 1")
      endif()
    endforeach()
  endforeach()
endforeach()
if(failures GREATER 0)
  message(FATAL_ERROR "kiln_layering: ${failures} include(s) against the folder dependencies above")
endif()
message("kiln_layering: ${checked} files include only the folders below them")
