"""Headless Chromium as a client type: the call page, its driver, and ``voiceedge browser``.

The page (``page/``) is served by every signaling front at ``GET /call`` (``page.py``); the
driver (``session.py``, ``runner.py``) runs it in one headless Chromium per process through
Playwright and turns each page's own view of its call into a ``SessionResult`` (``view.py``).
docs/browser.md has the whole story.
"""
