"""Example multicluster controllers, each short enough to read in one sitting."""
