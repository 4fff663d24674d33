#!/bin/sh
# The agent runs as each user (executors work on the user's files), so
# the package does not start it for anyone: it says how.
echo "metnos-agent: pair this device and start the agent as your user:"
echo "  metnos-agent register --server URL --token TOKEN"
echo "  systemctl --user enable --now metnos-agent    # or: metnos-agent install"
