# Bash completion (tools/bash-completion/nbdferry) for every installed
# program: bash-completion loads completions/NAME on first use of NAME,
# so the one script is installed under each program's name.
# tests/test_docs_names.py checks that this list has every program.
include(GNUInstallDirs)
foreach(prog nbdferry nbdferry-vhd nbdferry-vmdk nbdferry-vhdx nbdferry-qcow2
    nbdferry-verify nbdferry-status nbdferry-sync)
  install(FILES ${CMAKE_CURRENT_LIST_DIR}/nbdferry
          DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions
          RENAME ${prog})
endforeach()
