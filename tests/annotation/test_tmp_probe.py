import sys
import annotation.soft_lcs as s
import annotation
def test_x():
    print(s.__file__, annotation.__file__, __name__, sys.path[:3])
    assert 0
