"""Ferry: async model serving with dynamic micro-batching.

One import root: the top-level folders of the repository (`server/`, `batcher/`, ...) are this
package's subpackages (`ferry.server`, `ferry.batcher`, ...) through relative symlinks in
`ferry/`, so any tool finds `ferry.server.app` at `ferry/server/app.py`.
"""

__version__ = "0.1.0"
