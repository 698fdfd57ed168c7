# Checks that a committed file equals what the tool prints now.
#   -DTOOL=<path> -DARGS=<arguments separated by |> -DFILE=<committed file>
# Regenerate with the command printed on failure.
string(REPLACE "|" ";" _args "${ARGS}")
execute_process(COMMAND ${TOOL} ${_args} RESULT_VARIABLE rc OUTPUT_VARIABLE generated ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "mladcp ${_args} failed (${rc}): ${err}")
endif()
file(READ "${FILE}" committed)
if(NOT generated STREQUAL committed)
  string(REPLACE ";" " " _cmd "${_args}")
  message("---- generated now ----\n${generated}---- committed ----\n${committed}")
  message(FATAL_ERROR "${FILE} is out of date; regenerate it from the build folder with:\n"
                      "  bin/mladcp ${_cmd} > ${FILE}")
endif()
message("${FILE} is current")
