"""Ferry: async model serving with dynamic micro-batching.

One import root: the top-level folders of the repository (`server/`, `batcher/`, ...) are this
package's subpackages (`ferry.server`, `ferry.batcher`, ...), mapped by setuptools' package-dir.
"""

__version__ = "0.1.0"
