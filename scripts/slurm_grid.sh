#!/usr/bin/env bash
# The grid on a SLURM cluster: one array task per train stage, through DVC's remote and run-cache.
#
#   scripts/slurm_grid.sh [SBATCH_OPTIONS...]   # from the repository, on the login node
#   e.g. scripts/slurm_grid.sh --partition gpu --gres gpu:1 --time 4:00:00
#
# submits three jobs for the committed HEAD:
#   data    the data stages (`dvc repro --pull encode`), pushed with `dvc push --run-cache`;
#   train   an array, task i = line i of `python -m scripts.grid_stages` (a train stage and its
#           evaluate stage): `dvc repro --pull <stages>` (the data comes from the run-cache, only
#           what this task needs is downloaded), then `dvc push --run-cache`; starts after data;
#   report  after every task succeeded, in this checkout: `dvc repro --pull`, which trains
#           nothing (every run comes from the run-cache) and writes the report;
#           commit dvc.lock and reports/ afterwards.
# SBATCH_OPTIONS go to the array (the GPU jobs); SLURM_GRID_CPU_OPTS (words) to data and report;
# SLURM_GRID_PARALLEL=M runs at most M tasks at once (`--array 0-N%M`).
# Data and train jobs run in their own clone of HEAD (SLURM_GRID_SCRATCH, default $TMPDIR), deleted
# when they end: tasks never share a DVC workspace, and edits made after submitting change nothing.
# Needs: a default DVC remote committed in .dvc/config that every node reaches (s3://, ssh://, gs://
# or a shared absolute path), and MLFLOW_TRACKING_URI set to a shared `mlflow server` if runs
# should be tracked (sbatch passes the environment on). Logs: .dvc/tmp/slurm/.
set -euo pipefail

die() { echo "slurm_grid: $*" >&2; exit 2; }

# A clone of the submitted commit, removed when the job ends.
workspace() {
    local scratch=${SLURM_GRID_SCRATCH:-${TMPDIR:-/tmp}}
    work=$(mktemp -d "$scratch/ablation-${SLURM_JOB_ID:-local}.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    git clone -q --no-checkout "$GRID_REPO" "$work"
    cd "$work"
    git checkout -q "$GRID_REV"
    echo "slurm_grid: $1 in a clone of $GRID_REPO at $GRID_REV ($work)"
}

case "${1:-}" in
data)
    workspace data
    dvc repro --pull encode
    dvc push --run-cache
    ;;
task)
    workspace "task ${SLURM_ARRAY_TASK_ID:?task: SLURM_ARRAY_TASK_ID is not set}"
    stages=$(python -m scripts.grid_stages --index "$SLURM_ARRAY_TASK_ID")
    echo "slurm_grid: task $SLURM_ARRAY_TASK_ID: $stages"
    # shellcheck disable=SC2086 # one stage a word
    dvc repro --pull $stages
    dvc push --run-cache
    ;;
report)
    cd "$GRID_REPO"
    # The report is written here, for the commit the grid trained: a checkout that moved since
    # would retrain whatever changed, in a CPU job.
    [ "$(git rev-parse HEAD)" = "$GRID_REV" ] && git diff --quiet HEAD -- params.yaml dvc.yaml pipeline model ||
        die "report: $GRID_REPO is no longer at $GRID_REV; run \`dvc repro --pull\` in a checkout of it"
    # --pull: the run-cache, then the files of the stages it restores (`dvc pull --run-cache` would
    # fail here when dvc.lock does not list them yet).
    dvc repro --pull
    echo "slurm_grid: report written in $GRID_REPO/reports; commit dvc.lock and reports/"
    ;;
*)
    command -v sbatch >/dev/null || die "sbatch not found: run this on the cluster's login node"
    repo=$(git rev-parse --show-toplevel) || die "run it inside the repository"
    cd "$repo"
    git diff --quiet HEAD -- params.yaml dvc.yaml pipeline model .dvc/config ||
        die "params.yaml, dvc.yaml, pipeline/, model/ or .dvc/config has uncommitted changes: the jobs run HEAD; commit first"
    [ -n "$(dvc remote default --project)" ] ||
        die "no default DVC remote in .dvc/config: \`dvc remote add -d shared s3://bucket/path\`, then commit .dvc/config"
    count=$(python -m scripts.grid_stages --count)
    GRID_REV=$(git rev-parse HEAD)
    export GRID_REPO=$repo GRID_REV
    self=$repo/scripts/slurm_grid.sh
    logs=$repo/.dvc/tmp/slurm
    mkdir -p "$logs"
    submit() { local id; id=$(sbatch --parsable --export=ALL "$@"); echo "${id%%;*}"; }  # "id;cluster" -> id
    # shellcheck disable=SC2086 # SLURM_GRID_CPU_OPTS is a list of words
    data=$(submit --job-name ablation-data --output "$logs/%x-%j.out" ${SLURM_GRID_CPU_OPTS:-} "$self" data)
    train=$(submit --job-name ablation-train --output "$logs/%x-%A_%a.out" --dependency "afterok:$data" \
        --array "0-$((count - 1))${SLURM_GRID_PARALLEL:+%$SLURM_GRID_PARALLEL}" "$@" "$self" task)
    report=$(submit --job-name ablation-report --output "$logs/%x-%j.out" --dependency "afterok:$train" \
        ${SLURM_GRID_CPU_OPTS:-} "$self" report)
    echo "slurm_grid: $GRID_REV: data job $data, $count train tasks in array $train, report job $report; logs in $logs"
    ;;
esac
