// `cairn job start|stop|env|summary`: a batch job's daemon, started and stopped with the job, and
// what it did for the job (tools/job_summary.hpp). The Slurm
// prolog/task prolog/epilog (workflow/slurm/) and the PBS hook (workflow/pbs/) run these as root;
// a user runs them inside an allocation on sites without the prolog (docs/slurm.md).
#pragma once

#include <CLI/CLI.hpp>

namespace cairn::tool {

// Adds the `job` subcommand and its four subcommands to the tool; their exit status goes to rc.
void add_job_commands(CLI::App& app, int& rc);

}  // namespace cairn::tool
