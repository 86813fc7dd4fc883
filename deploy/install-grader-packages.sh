#!/bin/sh
# Installs the grader image's Python packages (OpenAI's list for its python graders, pinned in
# verifiers/grader-image/requirements.txt) into $VERITY_GRADER_PACKAGES while an image is built,
# so that python graders importing numpy, rapidfuzz, … work in containers that have no pip, no
# egress to PyPI, or a read-only root. Run as root in an image that holds `verity` and the
# sandbox's python3: pip and a C compiler (scikit-bio is published as source only) are installed
# for the step and removed after it; the layer is left readable by every user (the images run as
# uid 10001).
set -eu
: "${VERITY_GRADER_PACKAGES:?set VERITY_GRADER_PACKAGES to the folder of the layers}"
export DEBIAN_FRONTEND=noninteractive
# pip installs into the layer folder (--target), never into the system's Python; Debian's and
# Ubuntu's python3 mark themselves externally managed, which would refuse any pip install.
export PIP_BREAK_SYSTEM_PACKAGES=1
apt-get update
tools="python3-pip python3-dev gcc g++"
# libgomp1 stays: scikit-bio's compiled extensions use OpenMP.
# shellcheck disable=SC2086
apt-get install -y --no-install-recommends $tools libgomp1
verity graders install-packages
chmod -R a+rX "$VERITY_GRADER_PACKAGES"
# shellcheck disable=SC2086
apt-get purge -y --auto-remove $tools
rm -rf /var/lib/apt/lists/* /root/.cache/pip
