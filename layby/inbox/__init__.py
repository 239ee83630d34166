"""layby.inbox: the reviewers' inbox (`/inbox`), every request waiting for a reviewer on one
page. Signing in (`signin`) and ending a reviewer's sessions (`revocation`), the lists read
from the waiting runs (`waiting`) and the pages (`pages`); its HTTP edge is
`layby.http.inbox`, and its answers go through `layby.answering.answers` like the answer
page's."""
