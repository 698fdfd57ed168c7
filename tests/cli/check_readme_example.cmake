# Checks that the README shows the example program's code as it is compiled and run by the tests: the
# text between the two "// [example]" marker lines of the source (clang-format switches removed) must
# appear verbatim in the README.
#   -DSOURCE=<examples/basic_decode.cpp> -DREADME=<README.md>
file(READ "${SOURCE}" _src)
set(_marker "// [example]\n")
string(FIND "${_src}" "${_marker}" _first)
if(_first EQUAL -1)
  message(FATAL_ERROR "${SOURCE}: no ${_marker} marker")
endif()
string(LENGTH "${_marker}" _len)
math(EXPR _start "${_first} + ${_len}")
string(SUBSTRING "${_src}" ${_start} -1 _rest)
string(FIND "${_rest}" "${_marker}" _second)
if(_second EQUAL -1)
  message(FATAL_ERROR "${SOURCE}: no closing ${_marker} marker")
endif()
string(SUBSTRING "${_rest}" 0 ${_second} _block)
string(REGEX REPLACE "[ ]*// clang-format (on|off)\n" "" _block "${_block}")
string(REGEX REPLACE " +$" "" _block "${_block}")  # the closing marker's indentation
file(READ "${README}" _readme)
string(FIND "${_readme}" "${_block}" _at)
if(_at EQUAL -1)
  message(FATAL_ERROR "${README} does not contain the example region of ${SOURCE}; copy it again:\n${_block}")
endif()
message("README example matches ${SOURCE}")
