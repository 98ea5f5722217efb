# Bash completion (tools/bash-completion/nbdferry) for the C
# programs: bash-completion loads completions/NAME on first use of NAME,
# so the one script is installed under each program's name.
include(GNUInstallDirs)
foreach(prog nbdferry nbdferry-vhd nbdferry-vmdk nbdferry-vhdx nbdferry-verify)
  install(FILES ${CMAKE_CURRENT_LIST_DIR}/nbdferry
          DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions
          RENAME ${prog})
endforeach()
