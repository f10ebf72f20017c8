"""Forward-pass state kept for the backward passes, looked up by an integer token.

The forward graph op returns the token as an extra output and each gradient op built from it
takes the token as input, so a backward pass always finds the routing of its own forward pass.
Each forward op keeps only its latest state: running it again replaces the state of its previous
run. Reading does not remove, so several gradients of one forward pass (minimize beside a
global-norm summary, say) all find it, and memory stays bounded by the number of forward ops.
"""
import itertools

from sok1x.errors import Sok1xError


class Stash:
    """token -> saved state, the latest one per forward op."""

    def __init__(self):
        self._tokens = itertools.count(1)
        self._entries = {}
        self._latest = {}

    def put(self, forward_op, state):
        """Saves `state` as the latest of `forward_op` (a name) and returns its token (> 0)."""
        token = next(self._tokens)
        self._entries.pop(self._latest.get(forward_op), None)
        self._entries[token] = state
        self._latest[forward_op] = token
        return token

    def get(self, table_name, token):
        """Returns the state saved under `token`; raises Sok1xError naming `table_name` if its
        forward op has run again since."""
        state = self._entries.get(int(token))
        if state is None:
            raise Sok1xError(
                "the forward state of %s (token %d) is gone: its lookup ran again before this "
                "backward pass. Fetch a lookup and the gradients built from it in one sess.run."
                % (table_name, int(token)))
        return state

    def clear(self):
        """Forgets every saved state (and the tables it refers to); a backward pass of an earlier
        forward pass then raises as get() does."""
        self._entries.clear()
        self._latest.clear()
