# nbdferry-status: a Python 3 script (standard library only).
install(PROGRAMS ${CMAKE_CURRENT_LIST_DIR}/nbdferry-status
        DESTINATION ${CMAKE_INSTALL_BINDIR})
